package pool

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// Step-up authorization (the MCP authorization spec's scope challenge handling; RFC 6750
// section 3.1). A server that answers a request made with a user's token (a tool call, a
// listing) with 403 and a Bearer error="insufficient_scope" challenge did not serve it: the
// request is refused as sign_in_required, with a new authorization URL whose scope is the union
// of what the token's sign-in asked for and what the challenge names. The session that carried
// the token is not used again: the run's next call starts a fresh one, with the token of the
// user's new sign-in once there is one.
//
// The wider scope lives in the sign-in state and then in the token it yields, nowhere else: a
// later sign-in from scratch (the token dropped, the settings changed) asks for the
// registration's scopes again.
//
// Loops are bounded: a new sign-in is begun only for a challenge that names a scope the
// token's sign-in did not ask for (so each scope is asked for once, and a server that still
// refuses a scope the user was asked to grant gets no further sign-in), and for at most
// mcpserver.MaxScopes in all (the bound of a registration's scopes): a server that keeps
// naming new ones cannot keep sending the user to sign in.

// errScopeNotGranted: the server refuses the user's token for want of a scope that signing in
// again would not obtain.
var errScopeNotGranted = errors.New("pool: signing in again would not give the server the scope it asks for")

// stepUp is a server's scope challenge to a user's token: what the token's sign-in asked for
// (none for a token stored before the pool kept it) and what the challenge names.
type stepUp struct {
	asked     []string
	challenge []string
}

// scopes is what the new sign-in asks for: the union of the scopes the token's sign-in asked
// for (base, the registration's or discovered scopes, for a token that does not say) and the
// challenge's, which stands as given when it covers them all. errScopeNotGranted when the
// challenge names no scope, none that was not asked for already, or too many.
func (u *stepUp) scopes(ref string, base []string) ([]string, error) {
	prior := u.asked
	if len(prior) == 0 {
		prior = base
	}
	if len(u.challenge) == 0 {
		return nil, fmt.Errorf("%w: server %q refused the user's token for want of scope and named no scope it needs (RFC 6750 insufficient_scope): set the scopes the server needs in its registration (--oauth-scope)", errScopeNotGranted, ref)
	}
	var missing []string
	for _, sc := range u.challenge {
		if !slices.Contains(prior, sc) && !slices.Contains(missing, sc) {
			missing = append(missing, sc)
		}
	}
	if len(missing) == 0 {
		return nil, fmt.Errorf("%w: server %q refused the user's token for want of scope %s, which the user's sign-in asked for already: the authorization server did not grant it, so the user is not sent to sign in again for it (each scope is asked for once); calls that need no more than the token has go on",
			errScopeNotGranted, ref, strings.Join(u.challenge, " "))
	}
	wider := append(slices.Clone(prior), missing...)
	if covers(u.challenge, prior) {
		wider = slices.Clone(u.challenge)
	}
	if len(wider) > mcpserver.MaxScopes {
		return nil, fmt.Errorf("%w: server %q asks for scope %s, which with the scopes of the user's sign-in makes more than %d", errScopeNotGranted, ref, strings.Join(missing, " "), mcpserver.MaxScopes)
	}
	return wider, nil
}

// covers reports whether every scope of b is in a.
func covers(a, b []string) bool {
	for _, sc := range b {
		if !slices.Contains(a, sc) {
			return false
		}
	}
	return true
}

// scopeRefused is errSignInRequired for want of scope: the server's challenge to the user's
// token, which a new sign-in answers.
type scopeRefused struct{ up stepUp }

func (e *scopeRefused) Error() string {
	return fmt.Sprintf("%v: the server refused the user's token for want of scope %s", errSignInRequired, orNoScope(e.up.challenge))
}

func (e *scopeRefused) Unwrap() error { return errSignInRequired }

func orNoScope(scopes []string) string {
	if len(scopes) == 0 {
		return "(it names none)"
	}
	return strings.Join(scopes, " ")
}

// stepUpOf is the scope challenge err carries, if any: what a new sign-in widens.
func stepUpOf(err error) *stepUp {
	var sr *scopeRefused
	if errors.As(err, &sr) {
		return &sr.up
	}
	return nil
}

// scopeChallenge is a server's 403 insufficient_scope, as the spawner reports it, in err.
func scopeChallenge(err error) *spawner.Error {
	var se *spawner.Error
	if errors.As(err, &se) && se.InsufficientScope {
		return se
	}
	return nil
}

// refusedForScope is err as a scope challenge to the user's token t, or nil when it is none.
func refusedForScope(err error, t oauthToken) error {
	if c := scopeChallenge(err); c != nil {
		return &scopeRefused{up: stepUp{asked: t.Scopes, challenge: c.Scope}}
	}
	return nil
}

// sessionSignIn is, for a run's session of a server that signs each user in, whose token it
// carries: the run's tenant and user, the registration as resolved (without the token), and
// what the token's sign-in asked for.
type sessionSignIn struct {
	tenant, user string
	res          *mcpserver.Resolved
	scopes       []string
}

// failureSignInRequired: the server refused the call for want of a scope of the user's token
// (HTTP 403 insufficient_scope, which RFC 6750 says the server did not serve). The attempt was
// on record as dispatched before it was sent, so it is a dispatched failure of this class, not
// a refusal before dispatch; its message carries the URL the user signs in at for the wider
// scope, as a refusal sign_in_required does.
const failureSignInRequired = reasonSignInRequired

// tokenReplaced reports whether the user's stored token is another than the one sess carries:
// the user signed in again (for a wider scope, say) since the session started, or another run
// refreshed it. A token that cannot be read counts as unchanged: the session's own token then
// stands until the server refuses it.
func (s *Service) tokenReplaced(ctx context.Context, sess *session) bool {
	in := sess.signIn
	if in == nil || sess.reg == nil {
		return false
	}
	_, t, err := s.readToken(ctx, in.tenant, in.user, in.res.Ref)
	return err == nil && sess.reg.HeaderValues["Authorization"] != "Bearer "+t.AccessToken
}

// answerScopeChallenge is what a sign_in_required answer to a server's scope challenge to a
// run's session (err) says: the *signInError of a sign-in for the wider scope, or why none is
// begun (errScopeNotGranted). The session is not used again: the run's next call starts a
// fresh one. Nil when err is no scope challenge, or the session carries no user's token.
func (s *Service) answerScopeChallenge(ctx context.Context, sess *session, err error) error {
	if !sess.refusedForScope(err) {
		return nil
	}
	in := sess.signIn
	return s.signInNeeded(ctx, in.tenant, in.user, in.res, refusedForScope(err, oauthToken{Scopes: in.scopes}))
}

// refusedForScope notes that err is the server's scope challenge to the user's token sess
// carries, so the session is not used again (the run's next call starts a fresh one, and its
// sign-in answers the challenge); it reports whether it was.
func (sess *session) refusedForScope(err error) bool {
	if sess.signIn == nil || scopeChallenge(err) == nil {
		return false
	}
	sess.scopeRefused.Store(true)
	return true
}
