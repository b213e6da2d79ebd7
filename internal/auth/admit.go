package auth

import "context"

// admittingKey marks the context of an admission (Admit) for the KeyVerifier.
type admittingKey struct{}

// Admitting reports whether ctx is an admission's: the check of a stream's key before its
// request is read, which the server runs on the connection's reader, one stream at a time. A
// KeyVerifier whose answer must first be confirmed current (a replica on a shared store) may
// admit a key it holds as valid without that confirmation, because Authorize verifies the key
// again, current, before the handler runs: a key revoked elsewhere a moment ago is admitted
// and then refused, unread bodies cost it nothing more. A key it does not hold, or holds as
// revoked, it must confirm before refusing, so a key just created elsewhere is admitted.
func Admitting(ctx context.Context) bool {
	v, _ := ctx.Value(admittingKey{}).(bool)
	return v
}

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
		key, err := keyFromMetadata(ctx)
		if err != nil {
			return err
		}
		_, err = a.authenticate(context.WithValue(ctx, admittingKey{}, true), key)
		return err
	}
	// Public and internal methods, and methods without a rule: Authorize decides them from
	// the rule and the peer certificate, without reading anything more.
	_, err := a.Authorize(ctx, fullMethod)
	return err
}
