package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/mtls"
)

// TestAdmit: before a request is read, a caller must have proven who it is (a known key, or
// an allowed service certificate for an internal method); what the key may do is Authorize's
// to decide once the request is in.
func TestAdmit(t *testing.T) {
	keys := fakeKeys{HashKey("auditor-key"): {KeyID: "r", Role: RoleAuditor, Permissions: BuiltinRoles[RoleAuditor]}}
	a := NewAuthorizer(keys, map[string]Rule{
		"/x.S/Admin":    perm(MCPAdmin),
		"/x.S/Internal": internal("pool"),
		"/x.S/Health":   public,
	})
	withKey := func(k string) context.Context {
		return metadata.NewIncomingContext(context.Background(), metadata.Pairs(MetadataKey, k))
	}
	withCert := func(svc string) context.Context {
		cert := &x509.Certificate{URIs: []*url.URL{mtls.ServiceURI(svc)}}
		return peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{
			State: tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{cert}}},
		}})
	}
	for _, tc := range []struct {
		name   string
		ctx    context.Context
		method string
		code   codes.Code
	}{
		{"no key", context.Background(), "/x.S/Admin", codes.Unauthenticated},
		{"unknown key", withKey("nope"), "/x.S/Admin", codes.Unauthenticated},
		{"a known key, whatever it may do", withKey("auditor-key"), "/x.S/Admin", codes.OK},
		{"internal, allowed certificate", withCert("pool"), "/x.S/Internal", codes.OK},
		{"internal, another service's certificate", withCert("audit"), "/x.S/Internal", codes.PermissionDenied},
		{"internal, a key", withKey("auditor-key"), "/x.S/Internal", codes.PermissionDenied},
		{"public", context.Background(), "/x.S/Health", codes.OK},
		{"method without a rule", withKey("auditor-key"), "/x.S/Unlisted", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := a.Admit(tc.ctx, tc.method)
			require.Equal(t, tc.code, status.Code(err), "%v", err)
		})
	}
}
