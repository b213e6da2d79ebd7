// Package store keeps the registry's state: registrations (env values and URLs sealed), named
// secrets (sealed), and API keys (hashes only). Two back ends hold it: Bolt, one bbolt file
// (the embedded default), and Etcd, an etcd cluster shared by every replica. Both seal the same
// way, so neither holds a secret in clear; both make every write durable before it returns
// and before any in-memory state changes; and both run a write's hook in the write's own
// transaction, so its audit record commits with it or not at all.
package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"sort"
	"sync/atomic"
	"time"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/paging"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// Errors the service maps to codes.
var (
	ErrNotFound      = errors.New("not found")
	ErrExists        = errors.New("already exists")
	ErrStaleRevision = errors.New("stale revision")
	ErrBadPageToken  = paging.ErrBadToken // a page token this store did not issue for the list
)

// Hook runs inside a write's transaction with the recorder of that transaction: the audit
// records it takes commit with the change or not at all. An error rolls the write back.
type Hook func(rec audit.Recorder) error

// UpdateHook is UpdateServer's hook, which also sees the registration before and after. A
// back end that retries a transaction (etcd, when another replica wrote first) runs it again
// for each attempt.
type UpdateHook func(rec audit.Recorder, before, after *mcpserver.Registration) error

// SpoolConfig is the audit spool a store opens beside its data, for the outbox its hooks write
// into; the store fills in where the outbox lives.
type SpoolConfig = audit.SpoolConfig

func runHook(rec audit.Recorder, hook Hook) error {
	if hook == nil {
		return nil
	}
	return hook(rec)
}

// storedServer is a registration at rest: env keys in clear, values sealed as one blob bound
// to the ref; the URL sealed (its query may hold a credential) beside its masked form in
// clear, which is all responses show, so reading one never opens a seal.
type storedServer struct {
	Ref         string   `json:"ref"`
	Description string   `json:"description,omitempty"`
	Transport   string   `json:"transport"`
	Command     string   `json:"command,omitempty"`
	Args        []string `json:"args,omitempty"`
	EnvKeys     []string `json:"env_keys,omitempty"`
	EnvSealed   []byte   `json:"env_sealed,omitempty"`
	// URL is the clear URL of schema version 1; migration 2 seals it, and nothing writes it.
	URL                  string              `json:"url,omitempty"`
	URLSealed            []byte              `json:"url_sealed,omitempty"`
	URLMasked            string              `json:"url_masked,omitempty"`
	Headers              map[string]string   `json:"headers,omitempty"`
	Grants               []string            `json:"grants"`
	Include              []string            `json:"include,omitempty"`
	Exclude              []string            `json:"exclude,omitempty"`
	ToolPermissions      map[string][]string `json:"tool_permissions,omitempty"`
	ClientSessionTimeout time.Duration       `json:"client_session_timeout,omitempty"`
	ToolCallTimeout      time.Duration       `json:"tool_call_timeout,omitempty"`
	KeepMarkup           bool                `json:"keep_markup,omitempty"`
	StrictInputs         bool                `json:"strict_inputs,omitempty"`
	Prewarm              int                 `json:"prewarm,omitempty"`
	MaxResultBytes       int64               `json:"max_result_bytes,omitempty"`
	// OAuth is the sign-in (nothing secret: the client secret is a secret's name), and SignIn
	// its fingerprint, taken when the clear URL was at hand, so a policy needs no seal opened.
	OAuth      *mcpserver.OAuth `json:"oauth,omitempty"`
	SignIn     string           `json:"sign_in,omitempty"`
	Revision   int64            `json:"revision"`
	CreateTime time.Time        `json:"create_time"`
	UpdateTime time.Time        `json:"update_time"`

	// view memoizes ServerView's answer for this revision; a write replaces the whole entry.
	view atomic.Pointer[any]
}

func envContext(ref string) []byte { return []byte("registry/server/" + ref + "/env") }

func urlContext(ref string) []byte { return []byte("registry/server/" + ref + "/url") }

// sealURL stores url sealed, with its masked form in clear.
func (st *storedServer) sealURL(box *secretbox.Box, url string) {
	st.URL, st.URLSealed, st.URLMasked = "", nil, ""
	if url != "" {
		st.URLSealed = box.Seal([]byte(url), urlContext(st.Ref))
		st.URLMasked = mcpserver.MaskURL(url)
	}
}

// sealServer is r at rest: its env values and URL sealed with box.
func sealServer(box *secretbox.Box, r *mcpserver.Registration) (*storedServer, error) {
	st := &storedServer{
		Ref: r.Ref, Description: r.Description, Transport: r.Transport, Command: r.Command, Args: r.Args,
		Headers: r.Headers, Grants: r.Grants, Include: r.Filter.Include, Exclude: r.Filter.Exclude,
		ToolPermissions: r.ToolPermissions, ClientSessionTimeout: r.ClientSessionTimeout,
		ToolCallTimeout: r.ToolCallTimeout, KeepMarkup: r.KeepMarkup, StrictInputs: r.StrictInputs, Prewarm: r.Prewarm,
		MaxResultBytes: r.MaxResultBytes, OAuth: r.OAuth, SignIn: r.SignInFingerprint(),
		Revision: r.Revision, CreateTime: r.CreateTime, UpdateTime: r.UpdateTime,
	}
	if st.Grants == nil {
		st.Grants = []string{}
	}
	st.sealURL(box, r.URL)
	if len(r.Env) > 0 {
		for k := range r.Env {
			st.EnvKeys = append(st.EnvKeys, k)
		}
		sort.Strings(st.EnvKeys)
		plain, err := json.Marshal(r.Env)
		if err != nil {
			return nil, err
		}
		st.EnvSealed = box.Seal(plain, envContext(r.Ref))
	}
	return st, nil
}

// encodeServer is r as stored: sealed, then JSON.
func encodeServer(box *secretbox.Box, r *mcpserver.Registration) ([]byte, error) {
	st, err := sealServer(box, r)
	if err != nil {
		return nil, err
	}
	return json.Marshal(st)
}

// openServer is the registration with its env and URL in clear.
func openServer(box *secretbox.Box, st *storedServer) (*mcpserver.Registration, error) {
	r := st.withoutEnv()
	if len(st.URLSealed) > 0 {
		plain, err := box.Open(st.URLSealed, urlContext(st.Ref))
		if err != nil {
			return nil, err
		}
		r.URL = string(plain)
	}
	if len(st.EnvSealed) > 0 {
		plain, err := box.Open(st.EnvSealed, envContext(st.Ref))
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(plain, &r.Env); err != nil {
			return nil, fmt.Errorf("store: decode env of %s: %w", st.Ref, err)
		}
	}
	return r, nil
}

// withoutEnv is the registration with no env at all and its URL masked (mcpserver.MaskURL).
func (st *storedServer) withoutEnv() *mcpserver.Registration {
	return &mcpserver.Registration{
		Ref: st.Ref, Description: st.Description, Transport: st.Transport, Command: st.Command, Args: st.Args,
		URL: st.URLMasked, Headers: st.Headers, Grants: st.Grants,
		Filter:          mcpserver.ToolFilter{Include: st.Include, Exclude: st.Exclude},
		ToolPermissions: st.ToolPermissions, ClientSessionTimeout: st.ClientSessionTimeout,
		ToolCallTimeout: st.ToolCallTimeout, KeepMarkup: st.KeepMarkup, StrictInputs: st.StrictInputs, Prewarm: st.Prewarm,
		MaxResultBytes: st.MaxResultBytes, OAuth: st.OAuth,
		Revision: st.Revision, CreateTime: st.CreateTime, UpdateTime: st.UpdateTime,
	}
}

// masked is the registration with every env value empty and the keys kept, and its URL
// masked, without opening a seal.
func (st *storedServer) masked() *mcpserver.Registration {
	r := st.withoutEnv()
	if len(st.EnvKeys) > 0 {
		r.Env = make(map[string]string, len(st.EnvKeys))
		for _, k := range st.EnvKeys {
			r.Env[k] = ""
		}
	}
	return r
}

// policy is what the registration allows, without opening a seal.
func (st *storedServer) policy() mcpserver.Policy {
	return mcpserver.Policy{
		Ref: st.Ref, Description: st.Description, Grants: st.Grants, Revision: st.Revision, ToolPermissions: st.ToolPermissions,
		Filter: mcpserver.ToolFilter{Include: st.Include, Exclude: st.Exclude}, StrictInputs: st.StrictInputs,
		SignIn: st.SignIn,
	}
}

// view returns build's view of the registration, masked, built once per stored revision.
func (st *storedServer) viewOf(build func(*mcpserver.Registration) any) any {
	if v := st.view.Load(); v != nil {
		return *v
	}
	v := build(st.masked())
	st.view.Store(&v)
	return v
}

// closestRef is the ref of refs nearest to ref by edit distance, when one is near enough to be
// a typo of it (at most a third of its length, and 2 or fewer for short refs), or "".
func closestRef(ref string, refs iter.Seq[string]) string {
	best, bestDist := "", max(2, len(ref)/3)+1
	for k := range refs {
		// Refs whose lengths differ by more than the bound cannot be within it.
		if d := len(k) - len(ref); d >= bestDist || -d >= bestDist {
			continue
		}
		if d := humanize.EditDistance(ref, k); d < bestDist {
			best, bestDist = k, d
		}
	}
	return best
}

// serversTokenScope is the scope of ListServers' page tokens (paging.EncodeToken).
const serversTokenScope = "registry.servers"
