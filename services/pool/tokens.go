package pool

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/services/pool/internal/store"
)

// Agent tokens: the MCP front door's bearer tokens (frontdoor.go). A token speaks for one
// agent of one run, in the run's tenant: whoever holds it may list and call that agent's tools
// through /mcp, and nothing else. Tokens are minted by CreateAgentToken (run:execute, like
// every run RPC), stored as their SHA-256 only, expire (pool.Config.AgentTokenTTL, at most
// AgentTokenMaxTTL), are revoked one by one (RevokeAgentToken), and die with their run: a
// token of an ended run is refused, and ending the run deletes them. The secret is returned
// once, by CreateAgentToken, and is never logged or recorded: admin records and tool-call
// records name a token by its id.

// Defaults and bounds of agent tokens.
const (
	// DefaultAgentTokenTTL is a token's lifetime when CreateAgentToken names none
	// (frontdoor.token_ttl).
	DefaultAgentTokenTTL = time.Hour
	// DefaultAgentTokenMaxTTL is the longest lifetime a token may ask for
	// (frontdoor.token_max_ttl).
	DefaultAgentTokenMaxTTL = 24 * time.Hour
	// maxTokensPerRun bounds the tokens one run holds at once: each is a way in.
	maxTokensPerRun = 64
	// tokenSweepEvery is how often the idle reaper drops expired tokens (they are refused
	// from their expiry on; the sweep only frees their records).
	tokenSweepEvery = 30 * time.Second
	// agentTokenPrefix starts every token, so a leaked one is recognizable (secret scanners).
	agentTokenPrefix = "rfat_"
)

// Admin actions of agent tokens, as the pool records them.
const (
	actionAgentTokenCreate = "agent_token_create"
	actionAgentTokenRevoke = "agent_token_revoke"
	resourceAgentToken     = "agent_token"
)

// Errors of agent tokens.
var (
	errTokenNotFound  = errors.New("pool: no such agent token in this run")
	errTooManyTokens  = fmt.Errorf("pool: the run holds %d agent tokens already: revoke some (ringfence runs disconnect) before minting another", maxTokensPerRun)
	errFrontDoorOff   = errors.New("pool: the MCP front door is off on this server (no HTTP listener, or frontdoor.enabled is false): set RINGFENCE_HTTP_ADDR and RINGFENCE_FRONTDOOR__ENABLED=true")
	errTokenInvalid   = errors.New("the token is not valid: it is unknown, revoked, or was dropped with its run")
	errTokenExpired   = errors.New("the token has expired")
	errTokenRunEnded  = errors.New("the token's run has ended")
	errTokenMalformed = errors.New("the token is not an agent token")
)

// AgentToken is a token as callers read it (never its secret).
type AgentToken struct {
	ID, Tenant, RunID, Agent string
	CreateTime, ExpireTime   time.Time
	CreatedBy                string
}

func tokenFromStore(t store.AgentToken) AgentToken {
	return AgentToken{ID: t.ID, Tenant: t.Tenant, RunID: t.RunID, Agent: t.Agent, CreateTime: t.CreateTime, ExpireTime: t.ExpireTime, CreatedBy: t.CreatedBy}
}

// FrontDoorURL is where the MCP front door serves (the URL a client configuration names), or
// "" when it is off.
func (s *Service) FrontDoorURL() string { return s.cfg.FrontDoorURL }

// newAgentTokenSecret is a fresh token: the prefix and 32 random bytes, base64url.
func newAgentTokenSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return agentTokenPrefix + base64.RawURLEncoding.EncodeToString(b)
}

func hashAgentToken(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

func newTokenID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "tok-" + hex.EncodeToString(b)
}

// CreateAgentToken mints a token for agent of one of tenant's runs, valid for ttl (0: the
// default), and returns it with its secret, which exists nowhere else. The run must not have
// ended and the agent must be one of its graph's.
func (s *Service) CreateAgentToken(ctx context.Context, tenant, runID, agent string, ttl time.Duration) (*AgentToken, string, error) {
	if s.cfg.FrontDoorURL == "" {
		return nil, "", errFrontDoorOff
	}
	switch {
	case ttl == 0:
		ttl = s.cfg.AgentTokenTTL
	case ttl < time.Minute || ttl > s.cfg.AgentTokenMaxTTL:
		return nil, "", fieldError("ttl", "is %s; a token lives from 1m to %s (frontdoor.token_max_ttl)", ttl, s.cfg.AgentTokenMaxTTL)
	}
	r, err := s.lookup(ctx, runID, tenant)
	if err != nil {
		return nil, "", err
	}
	r.mu.Lock()
	state := r.rec.State
	r.mu.Unlock()
	if state != StateRunning && state != StatePaused {
		return nil, "", fmt.Errorf("%w (it %s): its agents take no client; start a new run", errRunEnded, state)
	}
	if err := s.load(ctx, r); err != nil {
		return nil, "", err
	}
	if _, ok := r.index.Agent(agent); !ok {
		return nil, "", fmt.Errorf("%w: graph %s v%d has no agent node %q (its agents: %s)", errUnknownAgent, r.id.GraphID, r.id.Version, agent, listed(r.index.AgentIDs()))
	}
	have, err := s.liveTokens(ctx, r)
	if err != nil {
		return nil, "", err
	}
	if len(have) >= maxTokensPerRun {
		return nil, "", errTooManyTokens
	}
	if err := s.spool.CanAccept(); err != nil {
		return nil, "", err
	}
	p, _ := auth.FromContext(ctx)
	secret := newAgentTokenSecret()
	now := s.now().UTC()
	t := store.AgentToken{ID: newTokenID(), Tenant: r.id.Tenant, RunID: r.id.ID, Agent: agent, Hash: hashAgentToken(secret),
		CreateTime: now, ExpireTime: now.Add(ttl), CreatedBy: p.Actor()}
	if err := s.tokens.PutAgentToken(ctx, t); err != nil {
		return nil, "", err
	}
	s.tokenLife(t) // its monotonic deadline starts now
	s.recordTokenEvent(ctx, actionAgentTokenCreate, t)
	out := tokenFromStore(t)
	return &out, secret, nil
}

// ListAgentTokens lists the tokens of one of tenant's runs (never their secrets).
func (s *Service) ListAgentTokens(ctx context.Context, tenant, runID string) ([]AgentToken, error) {
	r, err := s.lookup(ctx, runID, tenant)
	if err != nil {
		return nil, err
	}
	have, err := s.liveTokens(ctx, r)
	if err != nil {
		return nil, err
	}
	out := make([]AgentToken, 0, len(have))
	for _, t := range have {
		out = append(out, tokenFromStore(t))
	}
	return out, nil
}

// liveTokens are run r's stored tokens whose lifetime has not ended: one over by the monotonic
// clock alone (the wall clock was set back) is refused, so it is neither listed nor counted
// toward maxTokensPerRun while it waits, stored, for its wall-clock expiry and the reaper.
func (s *Service) liveTokens(ctx context.Context, r *run) ([]store.AgentToken, error) {
	have, err := s.tokens.RunAgentTokens(ctx, r.id.Tenant, r.id.ID)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(have, s.tokenOver), nil
}

// RevokeAgentToken revokes one token of one of tenant's runs: from then on it is refused, and
// the front door's sessions opened with it answer nothing more.
func (s *Service) RevokeAgentToken(ctx context.Context, tenant, runID, tokenID string) (*AgentToken, error) {
	r, err := s.lookup(ctx, runID, tenant)
	if err != nil {
		return nil, err
	}
	gone, err := s.tokens.DeleteAgentTokens(ctx, r.id.Tenant, r.id.ID, tokenID)
	if err != nil {
		return nil, err
	}
	if len(gone) == 0 {
		return nil, fmt.Errorf("%w: %q (ringfence runs connections --run %s lists them)", errTokenNotFound, tokenID, r.id.ID)
	}
	s.tokenLives.forget(gone[0].ID)
	s.recordTokenEvent(ctx, actionAgentTokenRevoke, gone[0])
	out := tokenFromStore(gone[0])
	return &out, nil
}

// AuthenticateAgentToken is the front door's check of a presented token: it is one the pool
// minted, unexpired, revoked by nobody, and its run has not ended. The error says which, for
// the 401's description; it never quotes the token.
func (s *Service) AuthenticateAgentToken(ctx context.Context, secret string) (*AgentToken, error) {
	if !strings.HasPrefix(secret, agentTokenPrefix) || len(secret) > 128 {
		return nil, errTokenMalformed
	}
	t, err := s.tokens.AgentTokenByHash(ctx, hashAgentToken(secret))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, errTokenInvalid
	case err != nil:
		return nil, err
	case s.tokenOver(t):
		return nil, errTokenExpired
	}
	r, err := s.lookup(ctx, t.RunID, t.Tenant)
	if errors.Is(err, errRunElsewhere) {
		// Running or paused on another pool host, which serves its calls (forwarded).
		out := tokenFromStore(t)
		return &out, nil
	}
	if err != nil {
		return nil, errTokenInvalid
	}
	r.mu.Lock()
	state := r.rec.State
	r.mu.Unlock()
	if state != StateRunning && state != StatePaused {
		return nil, errTokenRunEnded
	}
	out := tokenFromStore(t)
	return &out, nil
}

// dropRunTokens deletes the tokens of a run that ended: they die with it.
func (s *Service) dropRunTokens(ctx context.Context, r *run) {
	have, err := s.tokens.RunAgentTokens(ctx, r.id.Tenant, r.id.ID)
	if err != nil || len(have) == 0 {
		if err != nil {
			s.log.Warn("the agent tokens of an ended run could not be read to be dropped; they are refused all the same", "run", r.id.ID, "err", err)
		}
		return
	}
	ids := make([]string, len(have))
	for i, t := range have {
		ids[i] = t.ID
	}
	if _, err := s.tokens.DeleteAgentTokens(ctx, r.id.Tenant, r.id.ID, ids...); err != nil {
		s.log.Warn("the agent tokens of an ended run could not be dropped; they are refused all the same", "run", r.id.ID, "err", err)
		return
	}
	s.tokenLives.forget(ids...)
}

// tokenOver says whether token t has expired: at its stored expiry by the wall clock, or, by
// the monotonic clock, once the lifetime it was minted with has passed since this process
// first saw it. A clock set back (or a token minted while the clock ran ahead) so never keeps a
// token beyond the lifetime it was minted with.
func (s *Service) tokenOver(t store.AgentToken) bool { return s.over(s.tokenLife(t)) }

// tokenLife is token t's lifetime (clock.go), judged the first time this process sees it.
func (s *Service) tokenLife(t store.AgentToken) lifetime {
	return s.tokenLives.get(s, t.ID, t.CreateTime, t.ExpireTime, s.cfg.AgentTokenMaxTTL)
}

// dropExpiredTokens deletes tokens past their expiry (the idle reaper's turn), a bounded batch
// at a time.
func (s *Service) dropExpiredTokens(ctx context.Context, now time.Time) {
	expired, err := s.tokens.ExpiredAgentTokens(ctx, now, 256)
	if err != nil {
		s.log.Warn("expired agent tokens could not be read to be dropped; they are refused all the same", "err", err)
		return
	}
	for _, t := range expired {
		if _, err := s.tokens.DeleteAgentTokens(ctx, t.Tenant, t.RunID, t.ID); err != nil {
			s.log.Warn("an expired agent token could not be dropped; it is refused all the same", "token", t.ID, "err", err)
			return
		}
		s.tokenLives.forget(t.ID)
	}
	s.tokenLives.prune(s)
}

// recordTokenEvent puts a token's creation or revocation in the audit log as an admin event,
// naming the token by its id (its secret is nowhere). A record that cannot be spooled is
// logged: the token exists (or is gone) all the same, as a key's would.
func (s *Service) recordTokenEvent(ctx context.Context, action string, t store.AgentToken) {
	p, _ := auth.FromContext(ctx)
	id, name, role := p.AuditActor()
	change, _ := json.Marshal(map[string]any{"run_id": t.RunID, "agent": t.Agent, "expire_time": t.ExpireTime})
	rec := audit.NewAdminRecord("pool", t.Tenant, audit.AdminEvent{
		ActorKeyID: id, ActorKeyName: name, ActorRole: role, Action: action,
		ResourceType: resourceAgentToken, ResourceID: t.ID, Change: change,
	})
	if err := s.spool.Enqueue(context.WithoutCancel(ctx), rec); err != nil {
		s.log.Error("an agent token's admin event could not be recorded in the audit spool", "action", action, "token", t.ID, "err", err)
	}
}
