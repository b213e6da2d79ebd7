package registry

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	bolt "go.etcd.io/bbolt"
	"google.golang.org/grpc/codes"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/secretbox"
	"github.com/ringfence/ringfence/internal/testutil"
)

// remoteURL carries the canary as a query value; maskedRemoteURL is what responses show.
const (
	remoteURL       = "https://mcp.example.com/mcp?api_key=" + canary + "&region=eu"
	maskedRemoteURL = "https://mcp.example.com/mcp?api_key=" + SecretMask + "&region=" + SecretMask
)

func tickets() *registryv1.CreateServerRequest {
	return &registryv1.CreateServerRequest{
		Ref: "tickets", Transport: "streamable_http", Url: remoteURL,
		Headers: map[string]string{"Authorization": "tickets-token"},
		Grants:  []string{"process_spawn", "external_api_call"},
	}
}

// recordingDiscoverer keeps the ad-hoc servers it was asked to explore.
type recordingDiscoverer struct {
	adhoc chan *registryinternalv1.ResolveServerResponse
}

func (d recordingDiscoverer) ExploreTools(_ context.Context, req discovery.ExploreRequest) (*discovery.Listing, *typesv1.ExploreCallResult, error) {
	d.adhoc <- req.Adhoc
	return &discovery.Listing{}, nil, nil
}

// TestRemoteURLCanaryIsNeverShown: a remote registration whose URL query and header secret
// carry the canary; no gRPC or REST answer, refusal, log line, audit record or byte of the
// bolt file carries it, while the pool still gets the URL and the secret in clear.
func TestRemoteURLCanaryIsNeverShown(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	var shown []string
	show := func(s string) { shown = append(shown, s) }

	_, err := f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tickets-token", Value: "Bearer " + canary})
	require.NoError(t, err)
	created, err := f.client.CreateServer(ctx, tickets())
	require.NoError(t, err)
	require.Equal(t, maskedRemoteURL, created.GetServer().GetUrl())
	show(created.String())
	got, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: "tickets"})
	require.NoError(t, err)
	require.Equal(t, maskedRemoteURL, got.GetServer().GetUrl())
	show(got.String())
	list, err := f.client.ListServers(ctx, &registryv1.ListServersRequest{})
	require.NoError(t, err)
	require.Equal(t, maskedRemoteURL, list.GetServers()[0].GetUrl())
	show(list.String())

	// Sending the answer back keeps the URL; a new one is taken and shown masked.
	upd := &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: got.GetServer().GetUrl(),
		Headers: got.GetServer().GetHeaders(), Grants: got.GetServer().GetGrants(), Revision: got.GetServer().GetRevision()}
	updated, err := f.client.UpdateServer(ctx, upd)
	require.NoError(t, err)
	show(updated.String())
	code, body := f.rest(t, http.MethodPut, "/v1/mcp/servers/tickets", adminKey,
		`{"transport":"streamable_http","url":"https://mcp.example.com/v2?`+canary+`","headers":{"Authorization":"tickets-token"}}`)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `"url":"https://mcp.example.com/v2?`+SecretMask+`"`)
	show(body)
	code, body = f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey,
		`{"ref":"tickets-2","transport":"sse","url":"https://sse.example.com/sse?token=`+canary+`"}`)
	require.Equal(t, http.StatusOK, code, body)
	show(body)
	for _, path := range []string{"/v1/mcp/servers/tickets", "/v1/mcp/servers/tickets-2", "/v1/mcp/servers"} {
		code, body = f.rest(t, http.MethodGet, path, adminKey, "")
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, SecretMask)
		show(body)
	}

	// Refusals name the problem, never the URL's credential.
	for _, bad := range []string{
		"http://mcp.example.com/mcp?api_key=" + canary,
		"https://mcp.example.com/mcp?k=v#" + canary,
		"https://user:" + canary + "@mcp.example.com/mcp",
		"mcp.example.com/mcp?api_key=" + canary,
	} {
		req := tickets()
		req.Ref, req.Url = "bad", bad
		_, err := f.client.CreateServer(ctx, req)
		st := testutil.RequireStatus(t, err, codes.InvalidArgument)
		require.True(t, strings.HasPrefix(st.Message(), "registry: invalid url: "), st.Message())
		show(st.Message())
		code, body := f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey, `{"ref":"bad","transport":"streamable_http","url":"`+bad+`"}`)
		require.Equal(t, http.StatusBadRequest, code, body)
		show(body)
	}

	// An ad-hoc exploration records the server it starts, masked, and hands the pool the URL.
	disc := recordingDiscoverer{adhoc: make(chan *registryinternalv1.ResolveServerResponse, 1)}
	f.svc.SetDiscoverer(disc)
	adhoc := tickets()
	adhoc.Ref = ""
	explored, err := f.client.ExploreServer(ctx, &registryv1.ExploreServerRequest{Ref: "adhoc", Server: adhoc})
	require.NoError(t, err)
	show(explored.String())
	pool := <-disc.adhoc
	require.Equal(t, remoteURL, pool.GetServer().GetUrl(), "the pool connects to the URL itself")
	require.Equal(t, "Bearer "+canary, pool.GetHeaderValues()["Authorization"])

	resolved, err := f.svc.Internal().ResolveServer(ctx, &registryinternalv1.ResolveServerRequest{Ref: "tickets-2"})
	require.NoError(t, err)
	require.Equal(t, "https://sse.example.com/sse?token="+canary, resolved.GetServer().GetUrl(), "the pool's RPC answers the URL in clear")

	for _, s := range shown {
		require.NotContains(t, s, canary)
	}
	require.NoError(t, f.svc.Spool().Flush(ctx))
	records := f.audit.Records()
	require.NotEmpty(t, records)
	for _, r := range records {
		raw, err := json.Marshal(r)
		require.NoError(t, err)
		require.NotContains(t, string(raw), canary, "an audit record carries the canary")
	}
	require.NotContains(t, f.logs.String(), canary, "a log line carries the canary")
	raw, err := os.ReadFile(f.dbPath)
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary, "the bolt file holds the canary in clear")
	require.Contains(t, string(raw), "api_key", "query keys stay readable")
}

// TestUpdateWithTheMaskedURLKeepsTheStoredURL: GET shows the URL masked, so a PUT that sends
// it back keeps the stored URL; a masked URL that differs from the stored one's masked form,
// or with nothing stored behind it, is refused naming url.
func TestUpdateWithTheMaskedURLKeepsTheStoredURL(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	f.registerTickets(t, ctx)
	put := func(url string) (int, string) {
		return f.rest(t, http.MethodPut, "/v1/mcp/servers/tickets", adminKey,
			`{"transport":"streamable_http","url":"`+url+`","headers":{"Authorization":"tickets-token"},"grants":["process_spawn"]}`)
	}
	resolvedURL := func() string {
		res, err := f.svc.ResolveRegistration(ctx, "tickets")
		require.NoError(t, err)
		return res.URL
	}

	code, body := put(maskedRemoteURL)
	require.Equal(t, http.StatusOK, code, body)
	require.Equal(t, remoteURL, resolvedURL(), "the mask keeps the stored URL")
	res, err := f.svc.ResolveRegistration(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, []string{"process_spawn"}, res.Grants, "the rest of the update applies")

	for _, sent := range []string{
		strings.Replace(maskedRemoteURL, "mcp.example.com", "evil.example.com", 1),
		"https://mcp.example.com/mcp?api_key=" + SecretMask,
	} {
		code, body = put(sent)
		require.Equal(t, http.StatusBadRequest, code, body)
		require.Contains(t, body, "url: has the mask")
		require.Contains(t, body, "differs from the stored URL ("+maskedRemoteURL+")")
		require.Equal(t, remoteURL, resolvedURL(), "a refused update changes nothing")
	}

	fresh := tickets()
	fresh.Url = maskedRemoteURL
	msg := f.requireMaskRefusedWithNothingStored(t, ctx, fresh, "url: has the mask")
	require.Contains(t, msg, "no URL is stored")
}

// registerTickets registers tickets() with the secret its header names.
func (f *fixture) registerTickets(t *testing.T, ctx context.Context) {
	t.Helper()
	_, err := f.client.PutSecret(ctx, &registryv1.PutSecretRequest{Name: "tickets-token", Value: "t"})
	require.NoError(t, err)
	_, err = f.client.CreateServer(ctx, tickets())
	require.NoError(t, err)
}

// requireMaskRefusedWithNothingStored: a mask in a new registration (fresh, registered as
// "fresh") or an ad-hoc exploration has nothing stored behind it, so both are refused naming
// the field (want; the exploration's under "server."). It returns the create's message.
func (f *fixture) requireMaskRefusedWithNothingStored(t *testing.T, ctx context.Context, fresh *registryv1.CreateServerRequest, want string) string {
	t.Helper()
	fresh.Ref = "fresh"
	_, err := f.client.CreateServer(ctx, fresh)
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), want)
	f.svc.SetDiscoverer(fakeDiscoverer{})
	fresh.Ref = ""
	_, err = f.client.ExploreServer(ctx, &registryv1.ExploreServerRequest{Ref: "adhoc", Server: fresh})
	explore := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, explore.Message(), "server."+want)
	return st.Message()
}

// TestUpdateRecordsSayWhatSecretsChanged: an update's admin record says whether the URL and
// the env values changed, which the masked before and after cannot show, and never what
// they are.
func TestUpdateRecordsSayWhatSecretsChanged(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	f.registerTickets(t, ctx)
	_, err := f.client.CreateServer(ctx, docsSearch())
	require.NoError(t, err)

	update := func(t *testing.T, req *registryv1.UpdateServerRequest) map[string]any {
		t.Helper()
		require.NoError(t, f.svc.Spool().Flush(ctx))
		before := len(f.audit.Records())
		_, err := f.client.UpdateServer(ctx, req)
		require.NoError(t, err)
		require.NoError(t, f.svc.Spool().Flush(ctx))
		recs := f.audit.Records()
		require.Len(t, recs, before+1)
		rec := recs[len(recs)-1]
		require.Equal(t, audit.ActionUpdate, rec.Admin.Action)
		raw, _ := json.Marshal(rec)
		require.NotContains(t, string(raw), canary)
		var change map[string]any
		require.NoError(t, json.Unmarshal(rec.Admin.Change, &change))
		return change
	}
	remote := func(url string) *registryv1.UpdateServerRequest {
		return &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: url,
			Headers: map[string]string{"Authorization": "tickets-token"}}
	}
	stdio := func(e map[string]string) *registryv1.UpdateServerRequest {
		req := &registryv1.UpdateServerRequest{Ref: "docs-search", Command: "mcp-server-filesystem"}
		if e != nil {
			req.Env = env()
			for k, v := range e {
				req.Env.Fields[k] = env(k, v).Fields[k]
			}
		}
		return req
	}
	for _, tc := range []struct {
		name       string
		req        *registryv1.UpdateServerRequest
		url, envCh bool
	}{
		{"the masked URL sent back", remote(maskedRemoteURL), false, false},
		{"a new query value", remote("https://mcp.example.com/mcp?api_key=" + canary + "-2&region=eu"), true, false},
		{"the same URL in full", remote("https://mcp.example.com/mcp?api_key=" + canary + "-2&region=eu"), false, false},
		{"env kept by omission", stdio(nil), false, false},
		{"env kept by the mask", stdio(map[string]string{"APP_TOKEN": SecretMask}), false, false},
		{"a new env value", stdio(map[string]string{"APP_TOKEN": canary + "-3"}), false, true},
		{"an env value added", stdio(map[string]string{"APP_TOKEN": SecretMask, "REGION": "eu"}), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			change := update(t, tc.req)
			require.Equal(t, tc.url, change["url_changed"])
			require.Equal(t, tc.envCh, change["env_changed"])
			require.Contains(t, change, "before")
			require.Contains(t, change, "after")
		})
	}
}

// TestAURLFromBeforeTheRulesIsMigratedAndNotKeptBlindly: a registry file of schema version 1
// holds a plain-http URL to a public host in clear (allowed then). Opening it seals the URL;
// responses show it masked; and an update that sends the mask back (keep it) is refused as a
// new registration with that URL would be, naming the fix, while one sending an https URL
// is taken.
func TestAURLFromBeforeTheRulesIsMigratedAndNotKeptBlindly(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "registry.db")
	legacy := "http://mcp.example.com/mcp?api_key=" + canary
	db, err := bolt.Open(path, 0o600, nil)
	require.NoError(t, err)
	require.NoError(t, db.Update(func(tx *bolt.Tx) error {
		meta, err := tx.CreateBucket([]byte("meta"))
		if err != nil {
			return err
		}
		var v1 [8]byte
		binary.BigEndian.PutUint64(v1[:], 1)
		if err := meta.Put([]byte("schema_version"), v1[:]); err != nil {
			return err
		}
		servers, err := tx.CreateBucket([]byte("servers"))
		if err != nil {
			return err
		}
		return servers.Put([]byte("tickets"), []byte(`{"ref":"tickets","transport":"streamable_http","url":"`+legacy+`","grants":[],"revision":1}`))
	}))
	require.NoError(t, db.Close())

	box, err := secretbox.LoadOrCreate(filepath.Join(dir, "secrets.key"))
	require.NoError(t, err)
	roles, err := auth.NewRoles("")
	require.NoError(t, err)
	svc, err := Open(Config{DBPath: path, Secrets: box, Roles: roles, AuditSink: testutil.NewAuditRecorder()})
	require.NoError(t, err)
	t.Cleanup(func() { svc.Close() })
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NotContains(t, string(raw), canary, "the migrated file holds the URL's credential")

	ctx := auth.WithPrincipal(t.Context(), auth.Principal{KeyID: "k1", Role: auth.RoleAdmin})
	got, err := svc.GetServer(ctx, &registryv1.GetServerRequest{Ref: "tickets"})
	require.NoError(t, err)
	require.Equal(t, "http://mcp.example.com/mcp?api_key="+SecretMask, got.GetServer().GetUrl())
	res, err := svc.ResolveRegistration(ctx, "tickets")
	require.NoError(t, err)
	require.Equal(t, legacy, res.URL)

	_, err = svc.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: got.GetServer().GetUrl()})
	st := testutil.RequireStatus(t, err, codes.InvalidArgument)
	require.Contains(t, st.Message(), "invalid url: must use https")
	require.Contains(t, st.Message(), "use https://mcp.example.com")
	require.NotContains(t, st.Message(), canary)

	_, err = svc.UpdateServer(ctx, &registryv1.UpdateServerRequest{Ref: "tickets", Transport: "streamable_http", Url: "https://mcp.example.com/mcp?api_key=" + canary})
	require.NoError(t, err)
}

// TestTheSeedsTransportNamesAreStoredAsTheCanonicalOnes: a registration posted, put or patched
// with the seed's transport names (http, streamable-http, http-sse), as the CLI's --transport
// takes them, is accepted and stored under the canonical name, which every read returns.
func TestTheSeedsTransportNamesAreStoredAsTheCanonicalOnes(t *testing.T) {
	f := newFixture(t)
	ctx := f.admin(t)
	for alias, want := range map[string]string{"http": "streamable_http", "streamable-http": "streamable_http", "http-sse": "sse"} {
		ref := "alias-" + strings.ReplaceAll(alias, "-", "")
		code, body := f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey, `{"ref":"`+ref+`","transport":"`+alias+`","url":"https://mcp.example.com/mcp"}`)
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `"transport":"`+want+`"`, alias)
		code, body = f.rest(t, http.MethodGet, "/v1/mcp/servers/"+ref, adminKey, "")
		require.Equal(t, http.StatusOK, code, body)
		require.Contains(t, body, `"transport":"`+want+`"`, alias)

		code, body = f.rest(t, http.MethodPut, "/v1/mcp/servers/"+ref, adminKey, `{"transport":"`+alias+`","url":"https://mcp.example.com/other"}`)
		require.Equal(t, http.StatusOK, code, body)
		code, body = f.rest(t, http.MethodPatch, "/v1/mcp/servers/"+ref, adminKey, `{"transport":"`+alias+`"}`)
		require.Equal(t, http.StatusOK, code, body)
		got, err := f.client.GetServer(ctx, &registryv1.GetServerRequest{Ref: ref})
		require.NoError(t, err)
		require.Equal(t, want, got.GetServer().GetTransport(), alias)
	}
	req := &registryv1.CreateServerRequest{Ref: "grpc-alias", Transport: "http-sse", Url: "https://mcp.example.com/sse"}
	created, err := f.client.CreateServer(ctx, req)
	require.NoError(t, err)
	require.Equal(t, "sse", created.GetServer().GetTransport(), "gRPC takes them too")

	code, body := f.rest(t, http.MethodPost, "/v1/mcp/servers", adminKey, `{"ref":"bad","transport":"websocket","url":"https://mcp.example.com/mcp"}`)
	require.Equal(t, http.StatusBadRequest, code, body)
	require.Contains(t, body, `\"websocket\" is not a transport: use stdio, streamable_http or sse`)
}
