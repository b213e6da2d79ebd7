package spawner

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/ringfence/ringfence/internal/testutil/dockertest"
	"github.com/stretchr/testify/require"
)

// testPoolID gives each test its own pool label, so that the leak check of
// one test cannot be confused by another running in parallel.
func testPoolID(t testing.TB) string {
	name := strings.NewReplacer("/", "_", " ", "_", "#", "_").Replace(t.Name())
	if len(name) > 80 {
		name = name[:80]
	}
	return "test-" + name + "-" + randomID()[:6]
}

type env struct {
	t      testing.TB
	docker *client.Client
	image  string
	poolID string
}

// dockerEnv gives a test the engine, the fixture image and a pool ID, and
// checks at the end that no container of that pool is left.
func dockerEnv(t testing.TB) *env {
	t.Helper()
	e := &env{t: t, docker: dockertest.RequireEngine(t), image: dockertest.FixtureImage(t), poolID: testPoolID(t)}
	t.Cleanup(func() { e.requireNoContainers() })
	return e
}

func (e *env) config(mut ...func(*Config)) Config {
	cfg := Config{
		Image:  e.image,
		PoolID: e.poolID,
		Docker: e.docker,
		Logger: slog.New(slog.NewTextHandler(testWriter{e.t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	for _, m := range mut {
		m(&cfg)
	}
	return cfg
}

func (e *env) router(mut ...func(*Config)) *Router {
	e.t.Helper()
	r, err := New(e.config(mut...))
	require.NoError(e.t, err)
	e.t.Cleanup(func() { require.NoError(e.t, r.Close(context.Background())) })
	return r
}

// containers lists every container, running or not, labelled with the pool.
func (e *env) containers() []string {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := client.Filters{}
	f.Add("label", LabelPool+"="+e.poolID)
	list, err := e.docker.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	require.NoError(e.t, err)
	ids := make([]string, 0, len(list.Items))
	for _, c := range list.Items {
		ids = append(ids, c.ID)
	}
	return ids
}

func (e *env) requireNoContainers() {
	e.t.Helper()
	require.Empty(e.t, e.containers(), "containers of pool %s were left behind", e.poolID)
}

func fixtureSpec(args ...string) Spec {
	return Spec{
		ServerRef:        "fixture",
		Transport:        TransportStdio,
		Command:          "mcpfixture",
		Args:             args,
		Purpose:          PurposeDiscovery,
		HandshakeTimeout: 10 * time.Second,
	}
}

func spawn(t testing.TB, r *Router, spec Spec) *Session {
	t.Helper()
	s, err := r.Spawn(t.Context(), spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

func toolNames(tools []*mcp.Tool) []string {
	names := make([]string, len(tools))
	for i, tl := range tools {
		names[i] = tl.Name
	}
	return names
}

// callStructured calls a fixture tool and decodes its structured result.
func callStructured[T any](t testing.TB, s *Session, name string, args map[string]any) T {
	t.Helper()
	res, err := s.CallTool(t.Context(), &mcp.CallToolParams{Name: name, Arguments: args})
	require.NoError(t, err)
	require.False(t, res.IsError, "tool %s failed: %v", name, res.Content)
	raw, err := json.Marshal(res.StructuredContent)
	require.NoError(t, err)
	var out T
	require.NoError(t, json.Unmarshal(raw, &out))
	return out
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
