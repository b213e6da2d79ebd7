package pool

import (
	"context"
	"time"

	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// RunStore keeps the run records: the pool's bbolt file (store.Store, one host) or etcd
// (store.Etcd, shared by every pool host). Both pass one table of behaviours
// (services/pool/internal/store/runs_test.go).
type RunStore interface {
	// CreateRun stores a new run; an id its tenant has taken is store.ErrExists.
	CreateRun(ctx context.Context, r store.Run) error
	// PutRun records a run's new state for the host that owns it (r.Host); a run another host
	// owns, or that ended, is store.ErrNotOwner.
	PutRun(ctx context.Context, r store.Run) error
	// UpdateRun changes a run in one transaction; mutate may run more than once.
	UpdateRun(ctx context.Context, tenant, id string, mutate func(*store.Run) error) (store.Run, error)
	GetRun(ctx context.Context, tenant, id string) (store.Run, error)
	// ActiveRuns lists the running and paused runs host owns.
	ActiveRuns(ctx context.Context, host string) ([]store.Run, error)
}

// TokenStore keeps the MCP front door's agent tokens (hashed): the pool's bbolt file, or etcd
// with several pool hosts, so that every host's front door knows every token.
type TokenStore interface {
	PutAgentToken(ctx context.Context, t store.AgentToken) error
	AgentTokenByHash(ctx context.Context, hash string) (store.AgentToken, error)
	RunAgentTokens(ctx context.Context, tenant, run string) ([]store.AgentToken, error)
	DeleteAgentTokens(ctx context.Context, tenant, run string, ids ...string) ([]store.AgentToken, error)
	ExpiredAgentTokens(ctx context.Context, now time.Time, limit int) ([]store.AgentToken, error)
}

// OAuthStore keeps users' OAuth sign-ins (oauth.go): pending sign-ins, users' tokens (sealed
// by the pool, never in clear) and the listings servers declared to them, per tenant, user and
// server. The pool's bbolt file, or etcd beside the runs with several pool hosts, so that a
// callback reaching any host finishes a sign-in another began, and a run re-homed on another
// host keeps its user's token. Both pass one table of behaviours
// (services/pool/internal/store/oauth_test.go).
type OAuthStore interface {
	// PutSignInState stores a sign-in under the hash of its state, replacing the pending one of
	// the same tenant, user and server. Expired sign-ins leave by themselves (bbolt: those
	// expired by now, at this put; etcd: with their lease), unless taken first: the taker
	// checks the expiry.
	PutSignInState(ctx context.Context, hash string, st store.SignInState, now time.Time) error
	// TakeSignInState removes and returns a pending sign-in: good once, whoever asks.
	TakeSignInState(ctx context.Context, hash string) (store.SignInState, error)
	// PutOAuthToken stores a user's token from a new sign-in, replacing any.
	PutOAuthToken(ctx context.Context, tenant, user, ref string, sealed []byte) error
	// OAuthToken reads a user's token and the revision it was read at.
	OAuthToken(ctx context.Context, tenant, user, ref string) (store.SealedToken, error)
	// ReplaceOAuthToken stores a refreshed token if the stored one is still old, else
	// store.ErrTokenChanged.
	ReplaceOAuthToken(ctx context.Context, tenant, user, ref string, old store.SealedToken, sealed []byte) error
	// LockOAuthToken holds a user's token of a server against every other holder on every
	// pool host until unlock is called: a refresh holds it.
	LockOAuthToken(ctx context.Context, tenant, user, ref string) (unlock func(), err error)
	PutOAuthListing(ctx context.Context, tenant, user, ref string, l store.Listing) error
	OAuthListing(ctx context.Context, tenant, user, ref string) (store.Listing, error)
	// PutOAuthListingAt stores a listing if the user's stored token is still at, else
	// store.ErrTokenChanged: a run's session keeps the listing current with it (connect.go).
	PutOAuthListingAt(ctx context.Context, tenant, user, ref string, at store.SealedToken, l store.Listing) error
	// DropSignInAt deletes a user's token and listing if the stored token is still at, else
	// store.ErrTokenChanged: a drop decided on a token read never drops a newer one.
	DropSignInAt(ctx context.Context, tenant, user, ref string, at store.SealedToken) error
	// ResealSignIns re-seals, with r, every sealed token, verifier and client secret that only
	// an older key of the secrets key file opens, each write compared with what it read.
	ResealSignIns(ctx context.Context, r store.Resealer) (secretbox.ResealCount, error)

	// The clients the pool registered for itself (RFC 7591), one per issuer and redirect URI,
	// shared by every user, server and pool host. PutOAuthClient replaces; DropOAuthClient
	// deletes only while the stored client is still clientID; LockOAuthClient holds one
	// registration at a time there.
	PutOAuthClient(ctx context.Context, c store.OAuthClient) error
	OAuthClient(ctx context.Context, issuer, redirectURI string) (store.OAuthClient, error)
	DropOAuthClient(ctx context.Context, issuer, redirectURI, clientID string) error
	LockOAuthClient(ctx context.Context, issuer, redirectURI string) (unlock func(), err error)
}

var (
	_ RunStore   = (*store.Store)(nil)
	_ RunStore   = (*store.Etcd)(nil)
	_ TokenStore = (*store.Store)(nil)
	_ TokenStore = (*store.Etcd)(nil)
	_ OAuthStore = (*store.Store)(nil)
	_ OAuthStore = (*store.Etcd)(nil)
)
