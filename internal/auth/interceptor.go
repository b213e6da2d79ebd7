package auth

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/ringfence/ringfence/internal/mtls"
)

// MetadataKey carries the API key in gRPC metadata; HTTP clients send the X-API-Key header,
// which the gateway forwards under this name.
const MetadataKey = "x-api-key"

// KeyVerifier resolves the hash of an API key to its principal. The registry implements it
// in-process; other services reach the registry's AuthenticateKey over mutual TLS.
type KeyVerifier interface {
	VerifyKey(ctx context.Context, keySHA256 string) (Principal, error)
}

// ErrUnknownKey is returned by a KeyVerifier for a key it does not know or that is revoked.
var ErrUnknownKey = errors.New("auth: unknown or revoked API key")

// Authorizer enforces Rules on every call.
type Authorizer struct {
	keys  KeyVerifier
	rules map[string]Rule
}

// NewAuthorizer enforces rules, verifying API keys with keys.
func NewAuthorizer(keys KeyVerifier, rules map[string]Rule) *Authorizer {
	return &Authorizer{keys: keys, rules: rules}
}

// Authorize checks one call and returns ctx with the caller attached.
func (a *Authorizer) Authorize(ctx context.Context, fullMethod string) (context.Context, error) {
	rule, ok := a.rules[fullMethod]
	if !ok {
		// Fail closed: a method nobody wrote a rule for is nobody's to call.
		return nil, status.Errorf(codes.PermissionDenied, "auth: %s has no authorization rule", fullMethod)
	}
	if rule.Public {
		return ctx, nil
	}
	if len(rule.Internal) > 0 {
		svc, ok := mtls.PeerService(ctx)
		if !ok || !rule.allows(svc) {
			return nil, status.Errorf(codes.PermissionDenied,
				"auth: %s is internal: only the service certificates of %s may call it; API keys are never enough",
				shortMethod(fullMethod), strings.Join(rule.Internal, ", "))
		}
		return WithPrincipal(ctx, Principal{Service: svc}), nil
	}
	key, err := keyFromMetadata(ctx)
	if err != nil {
		return nil, err
	}
	p, err := a.authenticate(ctx, key)
	if err != nil {
		return nil, err
	}
	if !p.Has(rule.Permission) {
		return nil, status.Errorf(codes.PermissionDenied, "auth: %s needs permission %s, which role %q does not hold",
			shortMethod(fullMethod), rule.Permission, p.Role)
	}
	if rule.Deployment && p.Tenant != "" {
		return nil, status.Errorf(codes.PermissionDenied, "auth: %s changes or reveals what every tenant runs against, and this key is bound to tenant %q: use a key not bound to a tenant",
			shortMethod(fullMethod), p.Tenant)
	}
	return WithPrincipal(ctx, p), nil
}

// Authenticate checks that key is a known, unrevoked API key, before anything else about the
// request is read: the REST gateway calls it ahead of decoding a body, so a caller without a
// key cannot make a server buffer megabytes. Authorize still decides the permission.
func (a *Authorizer) Authenticate(ctx context.Context, key string) error {
	_, err := a.authenticate(ctx, strings.TrimSpace(key))
	return err
}

func (a *Authorizer) authenticate(ctx context.Context, key string) (Principal, error) {
	if key == "" {
		return Principal{}, status.Error(codes.Unauthenticated, "auth: missing API key: send it as x-api-key (gRPC metadata) or X-API-Key (HTTP header)")
	}
	p, err := a.keys.VerifyKey(ctx, HashKey(key))
	switch {
	case errors.Is(err, ErrUnknownKey):
		return Principal{}, status.Error(codes.Unauthenticated, "auth: unknown or revoked API key")
	case err != nil:
		if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
			return Principal{}, err
		}
		return Principal{}, status.Error(codes.Unavailable, "auth: cannot verify the API key right now; retry")
	}
	return p, nil
}

func keyFromMetadata(ctx context.Context) (string, error) {
	return SingleKey(metadata.ValueFromIncomingContext(ctx, MetadataKey))
}

// SingleKey is the one API key a request carries, from every value of its x-api-key metadata
// (or X-API-Key header). A key sent more than once is refused whatever the values: which one
// was meant cannot be told (as with a JSON key given twice), and a proxy that adds a key of
// its own must not decide who the caller is by the order of headers.
func SingleKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", nil
	case 1:
		return strings.TrimSpace(values[0]), nil
	}
	return "", status.Errorf(codes.Unauthenticated, "auth: the API key is sent %d times: send one, as x-api-key (gRPC metadata) or X-API-Key (HTTP header)", len(values))
}

// shortMethod turns /pkg.Service/Method into Service.Method for messages.
func shortMethod(full string) string {
	full = strings.TrimPrefix(full, "/")
	svc, m, ok := strings.Cut(full, "/")
	if !ok {
		return full
	}
	if i := strings.LastIndex(svc, "."); i >= 0 {
		svc = svc[i+1:]
	}
	return fmt.Sprintf("%s.%s", svc, m)
}
