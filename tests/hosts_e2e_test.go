package tests

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/etcdstore/etcdtest"
	"github.com/ringfence/ringfence/internal/testutil"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
)

// poolHosts is a split deployment with two ringfence-pool hosts (p1, p2) sharing an embedded
// three-member etcd cluster (mutual TLS), beside one registry, publisher and audit log, and a
// published graph "hosts" whose agent "a" calls fx__echo. extra names more pool hosts, each on
// bbolt alone (the benchmark's "bolt").
type poolHosts struct {
	t       testing.TB
	cluster *etcdtest.Cluster
	certs   string
	addr    map[string]string
	pools   map[string]*daemon
	poolIDs map[string]string
}

func startPoolHosts(t testing.TB, extra ...string) *poolHosts {
	return startPoolHostsWith(t, nil, extra...)
}

// startPoolHostsWith is startPoolHosts with more environment for each pool host (poolEnv nil:
// none).
func startPoolHostsWith(t testing.TB, poolEnv func(host string) []string, extra ...string) *poolHosts {
	image := dockertest.FixtureImage(t)
	cluster := etcdtest.Start(t, 3)
	d := &poolHosts{t: t, cluster: cluster, certs: cluster.CertDir, addr: map[string]string{}, pools: map[string]*daemon{}, poolIDs: map[string]string{}}
	internal := map[string]string{}
	for _, svc := range append([]string{"registry", "publisher", "audit", "p1", "p2"}, extra...) {
		d.addr[svc], internal[svc] = testutil.FreeAddr(t), testutil.FreeAddr(t)
	}
	tlsEnv := func(svc string) []string {
		return []string{
			"RINGFENCE_INTERNAL_ADDR=" + internal[svc],
			"RINGFENCE_TLS__CERT_FILE=" + filepath.Join(d.certs, identityOf(svc)+".pem"),
			"RINGFENCE_TLS__KEY_FILE=" + filepath.Join(d.certs, identityOf(svc)+"-key.pem"),
			"RINGFENCE_TLS__CLIENT_CA_FILE=" + filepath.Join(d.certs, "ca.pem"),
		}
	}
	startDaemonAt(t, "ringfence-audit", d.addr["audit"], append(tlsEnv("audit"), "RINGFENCE_PEERS__REGISTRY_ADDR="+internal["registry"])...)
	startDaemonAt(t, "ringfence-registry", d.addr["registry"], append(tlsEnv("registry"), "RINGFENCE_BOOTSTRAP_ADMIN_KEY="+adminKey,
		"RINGFENCE_PEERS__POOL_ADDR="+internal["p1"], "RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"])...)
	startDaemonAt(t, "ringfence-publisher", d.addr["publisher"], append(tlsEnv("publisher"),
		"RINGFENCE_PEERS__REGISTRY_ADDR="+internal["registry"], "RINGFENCE_PEERS__POOL_ADDR="+internal["p1"],
		"RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"])...)
	root := cluster.Root()
	for _, host := range append([]string{"p1", "p2"}, extra...) {
		d.poolIDs[host] = "e2e-hosts-" + host + "-" + randomHex(4)
		t.Cleanup(func() { requireNoContainers(t, d.poolIDs[host]) })
		env := append(tlsEnv(host),
			"RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE="+image, "RINGFENCE_SANDBOX__POOL_ID="+d.poolIDs[host],
			"RINGFENCE_PEERS__REGISTRY_ADDR="+internal["registry"], "RINGFENCE_PEERS__PUBLISHER_ADDR="+internal["publisher"],
			"RINGFENCE_PEERS__AUDIT_ADDR="+internal["audit"], "RINGFENCE_LOG_LEVEL=warn")
		if host == "p1" || host == "p2" {
			// A short lease keeps the wait for a dead host's runs to fail short; 5 s, not
			// less, so a live host keeps its lease through an etcd leader election on a
			// loaded machine (at 2 s a host lost it there and dropped its runs).
			env = append(env, "RINGFENCE_POOL__HOST_ID="+host, "RINGFENCE_POOL__HOST_LEASE_TTL=5s",
				"RINGFENCE_STORE__BACKEND=etcd",
				`RINGFENCE_STORE__ETCD_ENDPOINTS=["`+strings.Join(cluster.Endpoints(), `","`)+`"]`,
				"RINGFENCE_STORE__ETCD_CA_FILE="+filepath.Join(d.certs, "ca.pem"),
				"RINGFENCE_STORE__ETCD_CERT_FILE="+filepath.Join(d.certs, "pool.pem"),
				"RINGFENCE_STORE__ETCD_KEY_FILE="+filepath.Join(d.certs, "pool-key.pem"),
				"RINGFENCE_STORE__ETCD_PREFIX="+root)
		}
		if poolEnv != nil {
			env = append(env, poolEnv(host)...)
		}
		d.pools[host] = startDaemonAt(t, "ringfence-pool", d.addr[host], env...)
	}
	d.must(d.cli("registry", "servers", "add", "fx", "--command", "mcpfixture", "--grant", "process_spawn", "--grant", "external_api_call"))
	d.must(d.cli("publisher", "graphs", "create", "--graph", "hosts", "--agent", "a"))
	d.must(d.cli("publisher", "mcp-import", "--server", "fx", "--graph", "hosts", "--agent", "a", "--tool", "echo"))
	d.must(d.cli("publisher", "graphs", "publish", "--graph", "hosts"))
	return d
}

// identityOf is the service identity of a process: p1 and p2 are pools.
func identityOf(svc string) string {
	if strings.HasPrefix(svc, "p") && len(svc) == 2 || svc == "bolt" {
		return "pool"
	}
	return svc
}

func (d *poolHosts) cli(svc string, args ...string) result {
	identity := identityOf(svc)
	addr := d.addr[svc]
	if svc == "pools" { // both hosts, balanced by the client
		addr, identity = d.addr["p1"]+","+d.addr["p2"], "pool"
	}
	return runCmd(d.t, nil, []string{"RINGFENCE_ADDR=" + addr, "RINGFENCE_API_KEY=" + adminKey,
		"RINGFENCE_CA_FILE=" + filepath.Join(d.certs, "ca.pem"), "RINGFENCE_SERVER_IDENTITY=" + identity}, bin("ringfence"), args...)
}

func (d *poolHosts) must(r result) string {
	d.t.Helper()
	require.Equal(d.t, 0, r.Code, "stdout: %s\nstderr: %s", r.Stdout, r.Stderr)
	return r.Stdout
}

// mcpSession connects an MCP client with opts to the front door at url with an agent token.
func (d *poolHosts) mcpSession(t *testing.T, url, token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	hc := trustingClient(t, filepath.Join(d.certs, "ca.pem"))
	hc.Transport = bearerToken{token: token, next: hc.Transport}
	session, err := mcp.NewClient(&mcp.Implementation{Name: "hosts-e2e", Version: "1"}, opts).
		Connect(t.Context(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc}, nil)
	require.NoError(t, err)
	return session
}

// metric is the value of a gauge on the /metrics of a pool host, -1 when it has none.
func (d *poolHosts) metric(t *testing.T, host, name string) int {
	p := d.pools[host]
	resp, err := p.HTTP.Get(p.HTTPBase + "/metrics")
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+" "); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err)
			return n
		}
	}
	return -1
}

// bearerToken adds an agent token to every request.
type bearerToken struct {
	token string
	next  http.RoundTripper
}

func (b bearerToken) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.next.RoundTrip(r)
}

// hostRun is what the tests read of a run.
type hostRun struct {
	RunID     string `json:"run_id"`
	State     string `json:"state"`
	Host      string `json:"host"`
	HostLost  string `json:"host_lost"`
	EndReason string `json:"end_reason"`
}

func (d *poolHosts) run(svc string, args ...string) hostRun {
	d.t.Helper()
	var r hostRun
	require.NoError(d.t, json.Unmarshal([]byte(d.must(d.cli(svc, append(args, "-o", "json")...))), &r))
	return r
}

func (d *poolHosts) call(svc, runID, text string) result {
	return d.cli(svc, "runs", "call", "--run", runID, "--agent", "a", "--tool", "fx__echo", "--args", `{"text":"`+text+`"}`)
}

// TestTwoPoolHostsShareEtcd: two ringfence-pool processes on one etcd cluster. Runs are placed
// on the least loaded host; every request about a run, sent to either host, is served by its
// owner (the other forwards it over the internal plane, as the caller's), MCP front door calls
// included (an agent token works at either host's front door). A host killed with
// SIGKILL mid-run: its runs fail with the reason once its lease expires, and ResumeRun re-homes
// them on the live host, whose fresh session serves the next call. An etcd member killed: both
// keep working.
func TestTwoPoolHostsShareEtcd(t *testing.T) {
	// Access lines are info: the forwarded call below reads them.
	d := startPoolHostsWith(t, func(string) []string { return []string{"RINGFENCE_LOG_LEVEL=info"} })

	// Placement: the first run on the host that received it (both empty, the receiver wins
	// the tie), the second on the other (now the less loaded).
	first := d.run("p1", "runs", "start", "--graph", "hosts", "--run", "first")
	require.Equal(t, "p1", first.Host)
	second := d.run("p1", "runs", "start", "--graph", "hosts", "--run", "second")
	require.Equal(t, "p2", second.Host, "placed on the least loaded host")

	// A client given both hosts reaches either.
	require.Equal(t, "p2", d.run("pools", "runs", "show", "--run", "second").Host)

	// Forwarding: each run answers through either host, the call served by its owner.
	for _, via := range []string{"p1", "p2"} {
		for _, id := range []string{"first", "second"} {
			require.Contains(t, d.must(d.call(via, id, "via "+via+" to "+id)), "via "+via+" to "+id)
			require.Equal(t, map[string]string{"first": "p1", "second": "p2"}[id], d.run(via, "runs", "show", "--run", id).Host)
		}
	}
	// A refused call through the host that does not own the run (over REST, with no call id of
	// the caller's): the owner numbers and records the attempt, and its access line names it
	// with the caller's request id; the forwarding host's line names the run only, not an id of
	// its own that is on no record.
	p2 := d.pools["p2"]
	req, err := http.NewRequestWithContext(t.Context(), "POST", p2.HTTPBase+"/v1/runs/first:call", strings.NewReader(`{"agent":"a","tool":"fx__nope"}`))
	require.NoError(t, err)
	req.Header.Set("X-API-Key", adminKey)
	req.Header.Set("X-Request-Id", "forwarded-1")
	resp, err := p2.HTTP.Do(req)
	require.NoError(t, err)
	var refusal struct {
		Details []struct {
			CallID string `json:"call_id"`
		} `json:"details"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&refusal))
	resp.Body.Close()
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
	require.Len(t, refusal.Details, 1)
	d.pools["p1"].requireLogged(t, `request_id=forwarded-1 .*run_id=first call_id=`+refusal.Details[0].CallID+` attempt=1`)
	p2.requireLogged(t, `msg=rpc method=/ringfence.pool.v1.PoolService/CallTool code=NotFound .*request_id=forwarded-1 .*run_id=first\n`)
	// The caller's key and tenant travel with a forwarded request: a run of another tenant is
	// not found through either host.
	r := d.cli("p2", "runs", "show", "--run", "first", "--tenant", "other")
	require.NotEqual(t, 0, r.Code)
	require.Contains(t, r.Stderr, "no run")
	// An MCP client: a token minted through either host names the owner's front door, and works
	// at the other host's too, which forwards the client's calls to the owner as the token's.
	var conn struct {
		TokenID string `json:"token_id"`
		URL     string `json:"url"`
		Token   string `json:"token"`
	}
	require.NoError(t, json.Unmarshal([]byte(d.must(d.cli("p2", "runs", "connect", "--run", "first", "--agent", "a", "-o", "json"))), &conn))
	require.Equal(t, "https://"+d.pools["p1"].HTTPAddr+"/mcp", conn.URL)
	require.Contains(t, d.must(d.cli("p1", "runs", "connect", "--run", "second", "--agent", "a", "-o", "json")), d.pools["p2"].HTTPAddr+"/mcp")
	// It listens for changes of its tools (subscriptions/listen on 2026-07-28).
	listening := &mcp.ClientOptions{ToolListChangedHandler: func(context.Context, *mcp.ToolListChangedRequest) {}}
	session := d.mcpSession(t, "https://"+d.pools["p2"].HTTPAddr+"/mcp", conn.Token, listening)
	tools, err := session.ListTools(t.Context(), nil)
	require.NoError(t, err)
	require.Equal(t, "fx__echo", tools.Tools[0].Name)
	res, err := session.CallTool(t.Context(), &mcp.CallToolParams{Name: "fx__echo", Arguments: map[string]any{"text": "through the front door of p2"}})
	require.NoError(t, err)
	require.False(t, res.IsError, "%+v", res.Content)
	require.Contains(t, res.Content[0].(*mcp.TextContent).Text, "through the front door of p2")
	// p2 watches the run's listings on p1 (WatchAgentTools, a pool certificate's) while its
	// front door has the session, and no longer once it closed.
	watches := func(served, held int) func() bool {
		return func() bool {
			return d.metric(t, "p1", "ringfence_pool_listing_watches_served") == served && d.metric(t, "p2", "ringfence_pool_listing_watches_held") == held
		}
	}
	require.Eventually(t, watches(1, 1), 20*time.Second, 100*time.Millisecond, "p2 watches the run's listings on its owner")

	require.NoError(t, session.Close())
	require.Eventually(t, watches(0, 0), 20*time.Second, 100*time.Millisecond, "the watch ends with the session")
	require.Eventually(t, func() bool {
		return strings.Contains(d.cli("audit", "audit", "list", "--kind", "tool_call", "--run", "first", "-o", "json").Stdout, conn.TokenID)
	}, 20*time.Second, 200*time.Millisecond, "the owner's record names the token")

	// Only the owner records an attempt: the host that forwarded a call records none of its own
	// (no unknown_run refusal), and every call's outcome is on record once (two from the CLI, one
	// from the MCP client).
	require.Eventually(t, func() bool {
		out := d.cli("audit", "audit", "list", "--kind", "tool_call", "--run", "first", "-o", "json").Stdout
		return strings.Count(out, `"result": "succeeded"`) == 3
	}, 20*time.Second, 200*time.Millisecond)
	require.NotContains(t, d.cli("audit", "audit", "list", "--kind", "tool_call", "-o", "json").Stdout, "unknown_run")

	// p2 dies mid-run (its session to fx is live): once its lease expires, p1 fails its run with
	// the reason, and re-homes it on ResumeRun; the next call gets a fresh session on p1.
	d.pools["p2"].kill()
	var lost hostRun
	r = d.cli("p1", "runs", "show", "--run", "second")
	if r.Code != 0 { // before the lease expires, the owner is named as not answering
		require.Contains(t, r.Stderr, "the run's pool host p2 does not answer")
		require.NotContains(t, r.Stderr, "hint: is the server running")
	}
	require.Eventually(t, func() bool {
		r := d.cli("p1", "runs", "show", "--run", "second", "-o", "json")
		return r.Code == 0 && json.Unmarshal([]byte(r.Stdout), &lost) == nil && lost.State == "failed"
	}, 30*time.Second, 100*time.Millisecond)
	require.Equal(t, "p2", lost.HostLost)
	require.Contains(t, lost.EndReason, "pool host p2 is gone (it was stopped, or stopped answering)")
	resumed := d.run("p1", "runs", "resume", "--run", "second")
	require.Equal(t, "running", resumed.State)
	require.Equal(t, "p1", resumed.Host)
	require.Contains(t, d.must(d.call("p1", "second", "after p2 died")), "after p2 died")
	require.Contains(t, d.must(d.call("p1", "first", "p1 unharmed")), "p1 unharmed")
	// A new run goes to the only live host.
	require.Equal(t, "p1", d.run("p1", "runs", "start", "--graph", "hosts", "--run", "third").Host)
	// A client given both hosts (a static list, balanced round-robin) is served by the live one.
	for range 4 {
		require.Equal(t, "running", d.run("pools", "runs", "show", "--run", "third").State)
	}

	// p2 comes back (its orphaned container is swept at start) and takes new runs again.
	d.pools["p2"].start()
	require.Eventually(t, func() bool {
		r := d.cli("p2", "runs", "start", "--graph", "hosts", "-o", "json")
		var run hostRun
		return r.Code == 0 && json.Unmarshal([]byte(r.Stdout), &run) == nil && run.Host == "p2"
	}, 30*time.Second, 200*time.Millisecond, "p2 takes runs again")

	// etcd loses its leader: both hosts go on serving, forwarding included.
	d.cluster.Kill(d.cluster.WaitLeader(t))
	d.cluster.WaitLeader(t)
	require.Contains(t, d.must(d.call("p2", "first", "after etcd lost a member")), "after etcd lost a member")
	require.Contains(t, d.must(d.call("p1", "third", "still")), "still")
	d.must(d.cli("p2", "runs", "end", "--run", "first"))
	require.Equal(t, "completed", d.run("p1", "runs", "show", "--run", "first").State)
}
