package mcpserver

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheckEnvKey(t *testing.T) {
	allowed := []string{"APP_TOKEN", "DOCKER_HOST", "LD_PRELOAD", "PATH", "HOME", "lower_ok"}
	tests := []struct {
		key     string
		wantErr string
	}{
		{key: "APP_TOKEN"},
		{key: "lower_ok"},
		{key: "OTHER_TOKEN", wantErr: "not on the operator's allowlist"},
		{key: "DOCKER_HOST", wantErr: "DOCKER_"},
		{key: "docker_host", wantErr: "DOCKER_"},
		{key: "DOCKER_CONFIG", wantErr: "DOCKER_"},
		{key: "LD_PRELOAD", wantErr: "LD_"},
		{key: "LD_LIBRARY_PATH", wantErr: "LD_"},
		{key: "DYLD_INSERT_LIBRARIES", wantErr: "DYLD_"},
		{key: "PATH", wantErr: "never passed"},
		{key: "HOME", wantErr: "never passed"},
		{key: "NODE_OPTIONS", wantErr: "never passed"},
		{key: "GLIBC_TUNABLES", wantErr: "never passed"},
		{key: "HTTPS_PROXY", wantErr: "never passed"},
		{key: "CONTAINER_RUNTIME", wantErr: "CONTAINER_"},
		{key: "RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE", wantErr: "RINGFENCE_"},
		{key: "1ABC", wantErr: "a key is"},
		{key: "A=B", wantErr: "a key is"},
		{key: "", wantErr: "a key is"},
		{key: strings.Repeat("A", 200), wantErr: "a key is"},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			err := CheckEnvKey(tt.key, allowed)
			if tt.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.wantErr)
			require.True(t, errors.Is(err, ErrEnvKeyRefused))
		})
	}
}

func TestValidateRef(t *testing.T) {
	for _, ok := range []string{"a", "docs-search", "fs_2", strings.Repeat("z", 64)} {
		require.NoError(t, ValidateRef(ok), ok)
	}
	for _, bad := range []string{"", "Docs", "a b", "a.b", "a/b", "é", strings.Repeat("z", 65)} {
		err := ValidateRef(bad)
		require.Error(t, err, bad)
		require.Contains(t, err.Error(), "use 1 to 64 of a-z 0-9 _ -")
	}
}
