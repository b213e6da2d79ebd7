package auth

import "context"

// Admit decides, from a stream's headers and its connection alone, whether the caller has
// proven who it is: a method that needs an API key needs a known, unrevoked one
// (UNAUTHENTICATED otherwise), an internal method needs the certificate of a service allowed
// to call it, and a method without a rule is nobody's (PERMISSION_DENIED for both). The server
// calls it before a byte of the request is read, so a stranger cannot make it buffer
// messages; Authorize still decides the permission once the request is in.
//
// ctx carries the stream's incoming metadata and its peer, as gRPC's tap handle gives them.
// It costs a SHA-256 of the key and one KeyVerifier lookup.
func (a *Authorizer) Admit(ctx context.Context, fullMethod string) error {
	if rule, ok := a.rules[fullMethod]; ok && rule.Permission != "" {
		_, err := a.authenticate(ctx, keyFromMetadata(ctx))
		return err
	}
	// Public and internal methods, and methods without a rule: Authorize decides them from
	// the rule and the peer certificate, without reading anything more.
	_, err := a.Authorize(ctx, fullMethod)
	return err
}
