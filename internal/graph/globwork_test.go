package graph

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/fielderr"
)

// globHeavy is the graph of the reported CPU exhaustion: one agent holding fs.read, reaching
// nodes mcp_tool nodes of 62 near-maximal glob capabilities each (and the floor), under 4
// policies of 64 near-maximal glob revoke entries, none of which overlaps a capability. In
// shape "repro" (the report's) the globs' literal tails differ; in "open" each ends in a
// wildcard, so every comparison walks both globs. distinct gives each node its own globs.
func globHeavy(t testing.TB, shape string, nodes int, distinct bool) (*Graph, *fakeGrants) {
	t.Helper()
	g := &Graph{ID: "dos", Tenant: "default"}
	for p := range 4 {
		pol := Policy{ID: fmt.Sprintf("p%d", p)}
		for i := range 64 {
			k := p*64 + i
			switch shape {
			case "repro":
				pol.Revoke = append(pol.Revoke, fmt.Sprintf("fs.read:/%sX%03d", strings.Repeat("a*", 120), k))
			case "open":
				// 104 to 121 "/": a "*" never crosses one, and every capability has at most 101.
				pol.Revoke = append(pol.Revoke, "fs.read:*"+strings.Repeat("/*", 103+k%18)+fmt.Sprintf("/x%02d", k%100))
			case "cheap":
				// Decided at the second byte.
				pol.Revoke = append(pol.Revoke, fmt.Sprintf("fs.read:/b%03d/**", k))
			}
		}
		g.Policies = append(g.Policies, pol)
	}
	agent := agentNode("a", []string{"process_spawn", "external_api_call", "fs.read"})
	g.Nodes = append(g.Nodes, agent)
	for n := range nodes {
		salt := 0
		if distinct {
			salt = n
		}
		caps := append([]string(nil), floor...)
		for i := range 62 {
			switch shape {
			case "repro":
				caps = append(caps, fmt.Sprintf("fs.read:/%sY%02d%04d", strings.Repeat("a*", 119), i, salt))
			case "open":
				caps = append(caps, "fs.read:*"+strings.Repeat("/*", 40+i)+fmt.Sprintf("%04d*", salt))
			case "cheap":
				caps = append(caps, fmt.Sprintf("fs.read:/a%02d/%04d", i, salt))
			}
		}
		id := fmt.Sprintf("docs__read_%d", n)
		g.Nodes = append(g.Nodes, toolNode(t, id, "docs", fmt.Sprintf("read_%d", n), caps...))
		if n < MaxToolBindings {
			g.Nodes[0].Agent.ToolBindings = append(g.Nodes[0].Agent.ToolBindings, ToolBinding{Name: id, NodeID: id})
		} else {
			g.Edges = append(g.Edges, Edge{From: "a", To: id, Kind: EdgeTool})
		}
	}
	require.NoError(t, g.Validate())
	return g, grants(map[string][]string{"docs": {"process_spawn", "external_api_call", "fs.read"}})
}

func TestValidateDecidesTheReportedGraphWithinTheBound(t *testing.T) {
	g, r := globHeavy(t, "repro", 1, false)
	res := validate(t, g, r)
	require.True(t, res.OK(), "%+v", res.Violations)

	// The same comparisons still find a revoke entry that does overlap, and name its policy.
	g.Policies[2].Revoke[5] = "fs.read:/a*a*/**"
	g.Policies[3].Revoke[7] = "fs.read:/**Y00*"
	res = validate(t, g, r)
	require.Equal(t, []string{"agent_floor@docs__read_0"}, rules(res))
	require.Contains(t, res.Violations[0].Message, `change policy "p3", which revokes`)
	require.NotContains(t, res.Violations[0].Message, `"p2"`, "a*a*/** needs a / that no capability's one segment after / has")
}

func TestValidateRefusesPastTheGlobWorkBound(t *testing.T) {
	for _, tc := range []struct {
		name, shape string
		nodes       int
		distinct    bool
		field       string
	}{
		// Every comparison walks both globs to the end.
		{"wildcard ends", "open", 1, false, "policies"},
		// Cheap comparisons, but distinct capabilities on many nodes: 62 × 256 per node.
		{"many distinct capabilities", "repro", 400, true, "policies"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, r := globHeavy(t, tc.shape, tc.nodes, tc.distinct)
			v, err := NewValidator(r)
			require.NoError(t, err)
			_, err = v.Validate(t.Context(), g)
			fe, ok := fielderr.As(err)
			require.True(t, ok, "want a field error, got %v", err)
			require.Equal(t, tc.field, fe.Field)
			require.Contains(t, fe.Problem, fmt.Sprint(MaxGlobWork))
			require.Contains(t, fe.Problem, `agent "a"`)
		})
	}
}

// The same capabilities on many nodes are decided once per agent, so a large graph that
// repeats its globs stays well inside the bound.
func TestValidateDecidesRepeatedCapabilitiesOnce(t *testing.T) {
	g, r := globHeavy(t, "repro", 5000, false)
	res := validate(t, g, r)
	require.True(t, res.OK(), "%+v", res.Violations)
}

// A node whose agent floor fails is checked again to write the violation (naming the policies
// reads every revoke entry again), so repeating a failing node is work the bound counts.
func TestValidateCountsTheWorkOfWritingViolations(t *testing.T) {
	g, r := globHeavy(t, "repro", 5000, false)
	// The last entry of the last policy takes every capability away.
	g.Policies[3].Revoke[63] = "fs.read:/**"
	v, err := NewValidator(r)
	require.NoError(t, err)
	_, err = v.Validate(t.Context(), g)
	fe, ok := fielderr.As(err)
	require.True(t, ok, "want a field error, got %v", err)
	require.Equal(t, "policies", fe.Field)

	// A few such nodes are reported as violations.
	g.Nodes, g.Edges = g.Nodes[:4], nil
	g.Nodes[0].Agent.ToolBindings = g.Nodes[0].Agent.ToolBindings[:3]
	res := validate(t, g, r)
	require.Len(t, res.Violations, 3)
	require.Equal(t, RuleAgentFloor, res.Violations[0].Rule)
}

// cancelAfter is a context whose Err reports cancellation once it has been asked n times:
// the validation must keep asking while it compares, not only between nodes.
type cancelAfter struct {
	context.Context
	n atomic.Int64
}

func (c *cancelAfter) Err() error {
	if c.n.Add(-1) < 0 {
		return context.Canceled
	}
	return nil
}

func TestValidateStopsWhileComparingWhenTheCallerGoesAway(t *testing.T) {
	g, r := globHeavy(t, "open", 1, false)
	v, err := NewValidator(r)
	require.NoError(t, err)
	ctx := &cancelAfter{Context: t.Context()}
	ctx.n.Store(1) // the look before the only node passes; the next, among its comparisons, does not
	_, err = v.Validate(ctx, g)
	require.ErrorIs(t, err, context.Canceled)
}

// BenchmarkValidatePathological validates the reported graph (one node of 62 capabilities
// against 256 revoke entries, "repro"), and the costliest graphs of two shapes the bound lets
// through: globs that every comparison walks to the end ("open", one node, as many revoke
// entries as fit) and comparisons decided at once (capabilities that differ per node, as
// many nodes as fit), where the cost per comparison, not per byte, counts.
func BenchmarkValidatePathological(b *testing.B) {
	fits := func(g *Graph, r *fakeGrants) bool {
		v, err := NewValidator(r)
		require.NoError(b, err)
		_, err = v.Validate(b.Context(), g)
		if _, refused := fielderr.As(err); err != nil && !refused {
			b.Fatal(err)
		}
		return err == nil
	}
	for _, shape := range []string{"repro", "open", "cheap"} {
		b.Run(shape, func(b *testing.B) {
			g, r := globHeavy(b, shape, 1, false)
			switch shape {
			case "open":
				// Drop revoke entries until the graph fits the bound.
				for !fits(g, r) {
					p := &g.Policies[len(g.Policies)-1]
					if len(p.Revoke) == 1 {
						g.Policies = g.Policies[:len(g.Policies)-1]
					} else {
						p.Revoke = p.Revoke[:len(p.Revoke)-1]
					}
				}
				n := 0
				for _, p := range g.Policies {
					n += len(p.Revoke)
				}
				b.Logf("open: %d revoke entries fit the bound", n)
			case "cheap":
				// Add nodes until one more would not fit.
				lo, hi := 1, 2
				for {
					g, r = globHeavy(b, shape, hi, true)
					if !fits(g, r) {
						break
					}
					lo, hi = hi, hi*2
				}
				for hi-lo > 1 {
					mid := (lo + hi) / 2
					if g, r = globHeavy(b, shape, mid, true); fits(g, r) {
						lo = mid
					} else {
						hi = mid
					}
				}
				g, r = globHeavy(b, shape, lo, true)
				b.Logf("cheap: %d nodes fit the bound", lo)
			}
			v, err := NewValidator(r)
			require.NoError(b, err)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := v.Validate(b.Context(), g); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A large graph of ordinary globs fits the bound: 10,000 nodes, each of 100 agents reaching
// 99 of them, each node declaring its own fs.read glob, 40 glob revoke entries applying to
// every agent, and grants and bindings of fs.read:/srv/** (about 60% of the bound).
func TestValidateLargeOrdinaryGraphFitsTheBound(t *testing.T) {
	g, r := generated(t, 10000)
	for i := range g.Nodes {
		n := &g.Nodes[i]
		switch n.Kind {
		case KindAgent:
			n.Agent.CapabilityBindings = []string{"process_spawn", "external_api_call", "fs.read:/srv/**"}
		case KindMCPTool:
			n.MCPTool.CapabilityBindings = append(n.MCPTool.CapabilityBindings, fmt.Sprintf("fs.read:/srv/docs/%s/*.md", n.MCPTool.ToolName))
		}
	}
	g.Policies = nil
	for p := range 2 {
		pol := Policy{ID: fmt.Sprintf("secrets-%d", p)}
		for i := range 20 {
			pol.Revoke = append(pol.Revoke, fmt.Sprintf("fs.read:/srv/secret-%d%02d/**", p, i))
		}
		g.Policies = append(g.Policies, pol)
	}
	v, err := NewValidator(r)
	require.NoError(t, err)
	res, spent, err := v.validate(t.Context(), g)
	require.NoError(t, err)
	require.True(t, res.OK(), "%+v", res.Violations)
	require.Less(t, spent, int64(MaxGlobWork))
	t.Logf("%d units of %d", spent, MaxGlobWork)
}

// The rules write violations from lists cut to the entries that decide them; every violation
// must read as the rule writes it from the whole lists, and no node may pass or fail
// differently.
func TestValidateWritesTheViolationsTheWholeListsWould(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	pool := []string{
		"fs.read", "fs.read:/srv/**", "fs.read:/srv/*", "fs.read:/srv/a/*", "fs.read:/srv/*/x", "fs.read:/etc/**",
		"fs.read:/srv/a/x", "fs.read:/srv/b/**", "fs.read:**", "fs.write", "fs.write:/tmp/*", "email.send",
		"email.send:*@example.com", "process_spawn", "external_api_call",
	}
	pick := func(n int) []string {
		var out []string
		for range n {
			out = append(out, pool[rng.IntN(len(pool))])
		}
		return out
	}
	for round := range 200 {
		g := &Graph{ID: "g", Tenant: "default"}
		agents := 1 + rng.IntN(3)
		for a := range agents {
			g.Nodes = append(g.Nodes, agentNode(fmt.Sprintf("a%d", a), append([]string{"process_spawn", "external_api_call"}, pick(rng.IntN(4))...)))
		}
		for i := range 6 {
			id := fmt.Sprintf("docs__t%d", i)
			g.Nodes = append(g.Nodes, toolNode(t, id, "docs", fmt.Sprintf("t%d", i), append(append([]string(nil), floor...), pick(1+rng.IntN(4))...)...))
			for a := range agents {
				if rng.IntN(2) == 0 {
					g.Edges = append(g.Edges, Edge{From: fmt.Sprintf("a%d", a), To: id, Kind: EdgeTool})
				}
			}
		}
		for p := range rng.IntN(4) {
			pol := Policy{ID: fmt.Sprintf("p%d", p), Revoke: pick(1 + rng.IntN(5))}
			if rng.IntN(2) == 0 {
				pol.Agents = []string{fmt.Sprintf("a%d", rng.IntN(agents))}
			}
			g.Policies = append(g.Policies, pol)
		}
		r := grants(map[string][]string{"docs": append([]string{"process_spawn", "external_api_call"}, pick(rng.IntN(4))...)})
		res := validate(t, g, r)
		var want []Violation
		for i := range g.Nodes {
			n := &g.Nodes[i]
			if n.Kind != KindMCPTool {
				continue
			}
			if v := CheckCeiling(n, r.policies["docs"]); v != nil {
				want = append(want, *v)
			}
			for _, e := range g.Edges {
				if e.To == n.ID {
					if v := CheckAgentFloor(g, e.From, n); v != nil {
						want = append(want, *v)
					}
				}
			}
		}
		var got []Violation
		for _, v := range res.Violations {
			if v.Rule == RuleCeiling || v.Rule == RuleAgentFloor {
				got = append(got, v)
			}
		}
		require.Equal(t, want, got, "round %d: %+v", round, g)
	}
}

// Every agent of a graph may be under every policy: an agent's revoke entries are its
// policies' entries, not a copy of them per agent (4,000 agents × 16,384 entries would be
// 2 GB).
func TestValidateSharesRevokeEntriesAmongAgents(t *testing.T) {
	g := &Graph{ID: "g", Tenant: "default"}
	for p := range MaxPolicies {
		pol := Policy{ID: fmt.Sprintf("p%d", p)}
		for i := range MaxRevoke {
			pol.Revoke = append(pol.Revoke, fmt.Sprintf("fs.read:/x%03d/%02d", p, i))
		}
		g.Policies = append(g.Policies, pol)
	}
	for a := range 4000 {
		id := fmt.Sprintf("docs__t%d", a)
		g.Nodes = append(g.Nodes, agentNode(fmt.Sprintf("a%d", a), floor, ToolBinding{Name: id, NodeID: id}))
		// No capability: nothing to compare, but the agent's effective set is still read.
		g.Nodes = append(g.Nodes, toolNode(t, id, "docs", fmt.Sprintf("t%d", a)))
	}
	v, err := NewValidator(grants(map[string][]string{"docs": floor}))
	require.NoError(t, err)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	res, err := v.Validate(t.Context(), g)
	runtime.ReadMemStats(&after)
	require.NoError(t, err)
	require.Len(t, res.Violations, 4000, "each node misses the floor")
	require.Less(t, after.TotalAlloc-before.TotalAlloc, uint64(256<<20))
}
