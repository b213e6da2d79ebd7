package store

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
)

var (
	keyA = strings.Repeat("a1", 32)
	keyB = strings.Repeat("b2", 32)
)

// keyFile is a secrets key file holding lines, loaded as the server loads it.
func keyFile(t *testing.T, lines ...string) *secretbox.Box {
	t.Helper()
	path := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o600))
	box, err := secretbox.LoadOrCreate(path)
	require.NoError(t, err)
	return box
}

// logBuffer is a logger writing to a buffer that is safe to read while it writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// TestRotatedKeyResealsAtStart: a registry sealed under key A, opened with the key file "B, A",
// opens every secret, env value and URL, and re-seals them under B, so that afterwards B alone
// opens everything; the log says how many and that A's line can go, and shows no value or key.
func TestRotatedKeyResealsAtStart(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := cluster.Root()
	path := filepath.Join(t.TempDir(), "registry.db")
	open := map[string]func(t *testing.T, box *secretbox.Box, log *slog.Logger) api{
		"bbolt": func(t *testing.T, box *secretbox.Box, log *slog.Logger) api {
			cfg := spoolConfig(t, testutil.NewAuditRecorder())
			cfg.Logger = log
			s, err := OpenBolt(path, box, cfg)
			require.NoError(t, err)
			return s
		},
		"etcd": func(t *testing.T, box *secretbox.Box, log *slog.Logger) api {
			s, err := OpenEtcd(t.Context(), EtcdConfig{Client: cluster.Client(t, "registry"), Root: root, Box: box, Logger: log}, spoolConfig(t, testutil.NewAuditRecorder()))
			require.NoError(t, err)
			return s
		},
	}
	for name, open := range open {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			quiet := slog.New(slog.DiscardHandler)
			s := open(t, keyFile(t, keyA), quiet)
			_, err := s.PutSecret(ctx, "tickets-token", canary, nil)
			require.NoError(t, err)
			require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "docs", Transport: "stdio", Command: "x", Env: map[string]string{"APP_TOKEN": canary}}, nil))
			require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "remote", Transport: "streamable_http", URL: "https://mcp.example/?k=" + canary}, nil))
			require.NoError(t, s.CreateServer(ctx, &mcpserver.Registration{Ref: "plain", Transport: "stdio", Command: "x"}, nil))
			before, err := s.GetServer(ctx, "docs")
			require.NoError(t, err)
			require.NoError(t, s.Close())

			readAll := func(s api) {
				t.Helper()
				v, err := s.SecretValue(ctx, "tickets-token")
				require.NoError(t, err)
				require.Equal(t, canary, v)
				docs, err := s.GetServer(ctx, "docs")
				require.NoError(t, err)
				require.Equal(t, canary, docs.Env["APP_TOKEN"])
				require.Equal(t, before.Revision, docs.Revision, "a re-seal changes no revision")
				require.Equal(t, before.UpdateTime, docs.UpdateTime, "nor the update time")
				remote, err := s.GetServer(ctx, "remote")
				require.NoError(t, err)
				require.Equal(t, "https://mcp.example/?k="+canary, remote.URL)
			}

			var logs logBuffer
			s = open(t, keyFile(t, keyB, keyA), slog.New(slog.NewTextHandler(&logs, nil)))
			readAll(s)
			require.NoError(t, s.Close())
			require.Contains(t, logs.String(), "resealed=3", "the secret, the env and the URL")
			require.Contains(t, logs.String(), "the other lines can be removed")
			for _, hidden := range []string{canary, keyA, keyB} {
				require.NotContains(t, logs.String(), hidden)
			}

			logs = logBuffer{}
			s = open(t, keyFile(t, keyB, keyA), slog.New(slog.NewTextHandler(&logs, nil)))
			require.NoError(t, s.Close())
			require.Contains(t, logs.String(), "resealed=0", "nothing is left under A")

			s = open(t, keyFile(t, keyB), quiet)
			readAll(s)
			require.NoError(t, s.Close())
		})
	}
}

// TestEtcdResealKeepsANewerWrite: a re-seal commits only if the key is unchanged since it was
// read; a value another replica wrote meanwhile is read again, and kept.
func TestEtcdResealKeepsANewerWrite(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t, "registry")
	root := cluster.Root()
	ctx := t.Context()
	s, err := OpenEtcd(ctx, EtcdConfig{Client: cli, Root: root, Box: keyFile(t, keyA)}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	_, err = s.PutSecret(ctx, "tickets-token", "older", nil)
	require.NoError(t, err)
	require.NoError(t, s.Close())

	s, err = OpenEtcd(ctx, EtcdConfig{Client: cli, Root: root, Box: keyFile(t, keyA, keyB)}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	defer s.Close()
	key := s.space.Key(etcdSecrets, "tickets-token")
	stale, err := cli.Get(ctx, key)
	require.NoError(t, err)
	_, err = s.PutSecret(ctx, "tickets-token", "newer", nil) // another replica's write, after the read
	require.NoError(t, err)

	s.box = keyFile(t, keyB, keyA) // this replica's re-seal, with the rotated file
	var n secretbox.ResealCount
	require.NoError(t, s.resealKey(ctx, etcdSecrets, stale.Kvs[0], &n))
	v, err := s.SecretValue(ctx, "tickets-token")
	require.NoError(t, err)
	require.Equal(t, "newer", v, "the newer write stands")
	require.Equal(t, 1, n.Resealed, "and is what was re-sealed")

	resp, err := cli.Get(ctx, key)
	require.NoError(t, err)
	var st storedSecret
	require.NoError(t, json.Unmarshal(resp.Kvs[0].Value, &st))
	plain, err := keyFile(t, keyB).Open(st.Sealed, secretContext("tickets-token"))
	require.NoError(t, err, "sealed under B now")
	require.Equal(t, "newer", string(plain))
}

// TestEtcdResealLeavesAValueThatDoesNotDecode: a registration or secret in etcd that does not
// decode fails the reads that meet it, as it does with one key; a rotated key file does not
// turn it into a refused start.
func TestEtcdResealLeavesAValueThatDoesNotDecode(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t, "registry")
	root := cluster.Root()
	ctx := t.Context()
	s, err := OpenEtcd(ctx, EtcdConfig{Client: cli, Root: root, Box: keyFile(t, keyA)}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	_, err = s.PutSecret(ctx, "tickets-token", canary, nil)
	require.NoError(t, err)
	for _, kind := range []string{etcdServers, etcdSecrets} {
		_, err = cli.Put(ctx, s.space.Key(kind, "broken"), "{not json")
		require.NoError(t, err)
	}
	require.NoError(t, s.Close())

	s, err = OpenEtcd(ctx, EtcdConfig{Client: cli, Root: root, Box: keyFile(t, keyB, keyA)}, spoolConfig(t, testutil.NewAuditRecorder()))
	require.NoError(t, err)
	defer s.Close()
	_, err = s.GetServer(ctx, "broken")
	require.ErrorContains(t, err, "decode")
	v, err := s.SecretValue(ctx, "tickets-token")
	require.NoError(t, err)
	require.Equal(t, canary, v)
}
