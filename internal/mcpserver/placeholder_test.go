package mcpserver

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestPlaceholder(t *testing.T) {
	for _, v := range []string{
		"...", "…", " ... ", "<token>", "<your token here>", "{{ token }}", "${TICKETS_TOKEN}", "$TICKETS_TOKEN", "%TOKEN%",
		"changeme", "CHANGE_ME", "change-me", "replace me", "your-token-here", "YOUR_API_KEY", "insert your token", "TODO", "xxx", "XXXX-XXXX", "********",
		"Bearer ...", "Bearer ", "Bearer", "bearer <token>", "Bearer $TOKEN", "Basic xxx", "Token changeme", "",
	} {
		require.NotEmpty(t, Placeholder(v), "%q", v)
	}
	for _, v := range []string{
		"s3cr3t", "Bearer sk-live-0123456789", "tkt-demo-7f3a9c2e", "eu-west-1", "8080", "none", "x", "xy", "a...b", "Bearer x.y.z",
		"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----", "$", "<", "token-1", "Basic dXNlcjpwYXNz",
	} {
		require.Empty(t, Placeholder(v), "%q", v)
	}
	require.Equal(t, "is the authorization scheme Bearer with no credential after it (was the shell variable meant to follow it unset?)", Placeholder("Bearer "))
	require.Equal(t, "is the authorization scheme Bearer followed by a placeholder: the credential is an ellipsis", Placeholder("Bearer ..."))
}
