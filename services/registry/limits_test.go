package registry

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/testutil"
)

// longArgs is n args of size bytes each, every one different.
func longArgs(n, size int) []string {
	args := make([]string, n)
	for i := range args {
		args[i] = fmt.Sprintf("--opt-%02d=", i) + strings.Repeat("v", size-9)
	}
	return args
}

// atTheLimits is docsSearch with its ref, and 64 args of 4000 bytes (docs/api.md allows 4096).
func atTheLimits(ref string) *registryv1.CreateServerRequest {
	req := docsSearch()
	req.Ref = ref
	req.Args = longArgs(mcpserver.MaxArgs, 4000)
	return req
}

// adminRecord flushes the spool and returns the one admin record of action on ref, checked
// as the audit log will check it, with its change decoded.
func (f *fixture) adminRecord(t *testing.T, action, ref string) (audit.Record, map[string]any) {
	t.Helper()
	require.NoError(t, f.svc.Spool().Flush(t.Context()))
	var found []audit.Record
	for _, r := range f.audit.Records() {
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		require.NotContains(t, string(raw), canary, "an audit record carries the canary")
		if r.Admin != nil && r.Admin.ResourceType == resourceServer && r.Admin.Action == action && r.Admin.ResourceID == ref {
			found = append(found, r)
		}
	}
	require.Len(t, found, 1, "one %s record of %s", action, ref)
	rec := found[0]
	rec.Seq = 0
	require.NoError(t, rec.Validate())
	require.LessOrEqual(t, len(rec.Admin.Change), audit.MaxChangeBytes)
	var change map[string]any
	require.NoError(t, json.Unmarshal(rec.Admin.Change, &change))
	return rec, change
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// requireArgsRecorded: every arg of the recorded registration is there in full or as a
// summary whose digest is the arg's own, and at least one is a summary.
func requireArgsRecorded(t *testing.T, reg map[string]any, want []string) {
	t.Helper()
	args, ok := reg["args"].([]any)
	require.True(t, ok, "args keep their shape: %v", reg["args"])
	require.Len(t, args, len(want))
	var omitted int
	for i, a := range args {
		if s, ok := a.(string); ok {
			require.Equal(t, want[i], s)
			continue
		}
		omitted++
		sum := a.(map[string]any)
		require.Equal(t, "string", sum[audit.OmittedKey])
		require.Equal(t, float64(len(want[i])), sum["bytes"])
		require.Equal(t, sha256Hex(want[i]), sum["sha256"])
	}
	require.Positive(t, omitted, "some args are summarized")
}

// TestRegistrationsAtTheLimitsAreRecorded: a registration the registry accepts always has
// an audit record the log accepts: too large a change is recorded shortened, never refused
// as an internal error, and the server can still be updated.
func TestRegistrationsAtTheLimitsAreRecorded(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	req := atTheLimits("mid")
	created, err := f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	require.Equal(t, req.GetArgs(), created.GetServer().GetArgs(), "the registration itself is whole")

	_, change := f.adminRecord(t, audit.ActionCreate, "mid")
	require.Equal(t, true, change[audit.ShortenedKey], "the record says it was shortened")
	require.Equal(t, "mid", change["ref"])
	require.Equal(t, map[string]any{"APP_TOKEN": SecretMask}, change["env"], "secrets stay masked")
	require.Equal(t, []any{"process_spawn", "external_api_call"}, change["grants"])
	requireArgsRecorded(t, change, req.GetArgs())

	// Narrowing the grants of such a server is an update the operator must be able to make.
	upd, err := f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{
		Ref: "mid", Command: req.GetCommand(), Args: req.GetArgs(), Grants: []string{"process_spawn"},
	})
	require.NoError(t, err)
	require.Equal(t, []string{"process_spawn"}, upd.GetServer().GetGrants())
	_, change = f.adminRecord(t, audit.ActionUpdate, "mid")
	require.Equal(t, true, change[audit.ShortenedKey])
	before, after := change["before"].(map[string]any), change["after"].(map[string]any)
	require.Equal(t, []any{"process_spawn", "external_api_call"}, before["grants"])
	require.Equal(t, []any{"process_spawn"}, after["grants"], "what changed is in the record")
	requireArgsRecorded(t, after, req.GetArgs())

	// Each side fits on its own but not both together: the reviewer's 9 args of 4000 bytes.
	small := docsSearch()
	small.Ref, small.Args = "nine", longArgs(9, 4000)
	_, err = f.client.CreateServer(ctx, small)
	require.NoError(t, err)
	_, change = f.adminRecord(t, audit.ActionCreate, "nine")
	require.Nil(t, change[audit.ShortenedKey], "a change that fits is recorded whole")
	require.Len(t, change["args"], 9)
	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{
		Ref: "nine", Command: small.GetCommand(), Args: small.GetArgs(), Grants: []string{"process_spawn", "external_api_call"}, Revision: 1,
	})
	require.NoError(t, err)
	f.adminRecord(t, audit.ActionUpdate, "nine")
}

func TestManyToolPermissionsAreRecorded(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	req := docsSearch()
	req.Ref = "perms"
	req.ToolPermissions = make(map[string]*registryv1.ToolPermissions, mcpserver.MaxToolPermissionTools)
	for i := range mcpserver.MaxToolPermissionTools {
		reqs := make([]string, mcpserver.MaxToolRequirements)
		for j := range reqs {
			reqs[j] = fmt.Sprintf("docs.read:/handbook/section-%02d/{path}", j)
		}
		req.ToolPermissions[fmt.Sprintf("tool_%03d_%s", i, strings.Repeat("x", 100))] = &registryv1.ToolPermissions{Required: reqs}
	}
	_, err := f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	_, change := f.adminRecord(t, audit.ActionCreate, "perms")
	require.Equal(t, true, change[audit.ShortenedKey])
	require.Equal(t, []any{"/srv/docs"}, change["args"], "small fields stay whole")

	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{
		Ref: "perms", Command: req.GetCommand(), Args: req.GetArgs(), ToolPermissions: req.GetToolPermissions(), Grants: []string{"process_spawn"},
	})
	require.NoError(t, err)
	f.adminRecord(t, audit.ActionUpdate, "perms")
}

// fakeDiscoverer answers every exploration with an empty listing.
type fakeDiscoverer struct{}

func (fakeDiscoverer) ExploreTools(context.Context, discovery.ExploreRequest) (*discovery.Listing, *typesv1.ExploreCallResult, error) {
	return &discovery.Listing{}, nil, nil
}

func TestExploringAnOversizedAdhocServerIsRecorded(t *testing.T) {
	f := newFixture(t)
	f.svc.SetDiscoverer(fakeDiscoverer{})
	spec := atTheLimits("")
	spec.Description = strings.Repeat("d", mcpserver.MaxDescription)
	_, err := f.client.ExploreServer(f.admin(t), &registryv1.ExploreServerRequest{Ref: "adhoc", Server: spec})
	require.NoError(t, err)
	_, change := f.adminRecord(t, audit.ActionExplore, "adhoc")
	require.Equal(t, true, change[audit.ShortenedKey])
	require.Equal(t, map[string]any{"APP_TOKEN": SecretMask}, change["env"])
	requireArgsRecorded(t, change, spec.GetArgs())
}

// A record the log would refuse for any other reason fails the request with that reason,
// not as an internal error.
func TestAnUnrecordableChangeIsNotAnInternalError(t *testing.T) {
	f := newFixture(t)
	err := f.svc.errors.Status(t.Context(), unrecordable(fmt.Errorf("%w: admin.change is 70000 bytes, limit 65536", audit.ErrInvalidRecord)))
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Equal(t, "registry: the change cannot be recorded in the audit log, so nothing was changed: audit: invalid record: admin.change is 70000 bytes, limit 65536", st.Message())
}

// TestARegistrationReadIsWrittenBackAsItIs: a PUT of what GET answered, output-only fields
// (create_time, update_time, warm) and masks included, is accepted and keeps the stored
// secret; its revision still guards against a change made since the read.
func TestARegistrationReadIsWrittenBackAsItIs(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)

	code, read := f.rest(t, http.MethodGet, "/v1/mcp/servers/docs-search", adminKey, "")
	require.Equal(t, http.StatusOK, code, read)
	var shown map[string]any
	require.NoError(t, json.Unmarshal([]byte(read), &shown))
	require.Contains(t, shown, "create_time")
	shown["warm"] = map[string]any{"ready": 1, "starting": 0} // as a registration with prewarm shows it
	shown["description"] = "edited"
	edited, err := json.Marshal(shown)
	require.NoError(t, err)

	code, body := f.rest(t, http.MethodPut, "/v1/mcp/servers/docs-search", adminKey, string(edited))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"description":"edited"`)
	res, err := f.svc.ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, canary, res.Env["APP_TOKEN"], "the mask keeps the stored value")
	require.Equal(t, int64(2), res.Revision)

	code, body = f.rest(t, http.MethodPut, "/v1/mcp/servers/docs-search", adminKey, string(edited))
	require.Equal(t, http.StatusConflict, code, "the read's revision is stale now: %s", body)
}

// TestUpdateWithTheMaskKeepsTheStoredSecret: GET shows every env value as the mask, so a
// PUT that sends the mask back keeps the stored value; a mask for a key with no stored value
// is refused, naming the key, and so is one on create.
func TestUpdateWithTheMaskKeepsTheStoredSecret(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)

	put := func(body string) (int, string) {
		return f.rest(t, http.MethodPut, "/v1/mcp/servers/docs-search", adminKey, body)
	}
	code, body := put(`{"command":"mcp-server-filesystem","args":["/srv/other"],"env":{"APP_TOKEN":"********"}}`)
	require.Equal(t, http.StatusOK, code, body)
	res, err := f.svc.ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, canary, res.Env["APP_TOKEN"], "the mask keeps the stored value")
	require.Equal(t, []string{"/srv/other"}, res.Args, "the rest of the update applies")
	resolved, err := f.svc.Internal().ResolveServer(ctx, &registryinternalv1.ResolveServerRequest{Ref: "docs-search"})
	require.NoError(t, err)
	require.Equal(t, canary, resolved.GetEnv()["APP_TOKEN"], "the pool's RPC answers the stored value")

	code, body = put(`{"command":"mcp-server-filesystem","env":{"APP_TOKEN":"********","REGION":"********"}}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, "env.REGION")
	require.Contains(t, body, "no value is stored for it")
	res, err = f.svc.ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"APP_TOKEN": canary}, res.Env, "a refused update changes nothing")
	require.Equal(t, int64(2), res.Revision)

	// A new value and the mask side by side: the one replaced, the other kept.
	_, err = f.client.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "x", Env: env("APP_TOKEN", SecretMask, "REGION", "eu")})
	require.NoError(t, err)
	res, err = f.svc.ResolveRegistration(ctx, "docs-search")
	require.NoError(t, err)
	require.Equal(t, map[string]string{"APP_TOKEN": canary, "REGION": "eu"}, res.Env)

	// Nothing is stored for a new registration or an ad-hoc exploration.
	fresh := docsSearch()
	fresh.Env = env("APP_TOKEN", SecretMask)
	f.requireMaskRefusedWithNothingStored(t, ctx, fresh, "env.APP_TOKEN")
}
