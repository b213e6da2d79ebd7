package graph

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/fielderr"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// The declaration screen runs on every pinned mcp_tool node that is stored or published, not
// only on what an import takes from a live listing: an author can write a node by hand with a
// correct pin, and a draft stored before the screen learned a check must not publish past it.
// The verdict is a function of the declaration alone, the same one discovery reaches (no
// other server's names are compared), and the node's flags are always the screen's.

// Verdict is the declaration screen's verdict on one pinned declaration.
type Verdict struct {
	// Refusals are the hard failures: the declaration cannot be represented or used safely.
	Refusals []discovery.Finding
	// Flags are the heuristic findings (at most MaxFlags), which the node stores for reviewers.
	Flags []discovery.Finding
}

// ScreenDeclaration screens one declaration as discovery does. Verdicts are remembered by a
// digest of the exact bytes screened: a draft is screened on every write and every publish,
// and compiling schemas costs far more than hashing them.
func ScreenDeclaration(d mcpdecl.Declaration) Verdict {
	key := declarationKey(d)
	verdicts.Lock()
	v, ok := verdicts.m[key]
	verdicts.Unlock()
	if ok {
		return v
	}
	for _, f := range discovery.FromScreen(screen.ScreenTool(d, screen.Context{}).Findings) {
		switch {
		case f.Severity == discovery.SeverityHardFailure:
			v.Refusals = append(v.Refusals, f)
		case len(v.Flags) < MaxFlags:
			v.Flags = append(v.Flags, f)
		}
	}
	verdicts.Lock()
	if len(verdicts.m) >= maxVerdicts {
		clear(verdicts.m)
	}
	verdicts.m[key] = v
	verdicts.Unlock()
	return v
}

// maxVerdicts bounds the remembered verdicts: more than one 10,000-node graph's worth.
const maxVerdicts = 1 << 15

var verdicts = struct {
	sync.Mutex
	m map[[sha256.Size]byte]Verdict
}{m: make(map[[sha256.Size]byte]Verdict)}

// declarationKey digests the six fields, each behind its length, so no two declarations share
// a key by moving bytes from one field to the next. A publish digests every node of a graph,
// so the bytes are gathered in a reused buffer rather than allocated per field.
func declarationKey(d mcpdecl.Declaration) [sha256.Size]byte {
	bp := keyBuffers.Get().(*[]byte)
	b := (*bp)[:0]
	for _, s := range [...]string{d.Name, d.Title, d.Description} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(s)))
		b = append(b, s...)
	}
	for _, raw := range [...][]byte{d.InputSchema, d.OutputSchema, d.Annotations} {
		b = binary.BigEndian.AppendUint64(b, uint64(len(raw)))
		b = append(b, raw...)
	}
	key := sha256.Sum256(b)
	if cap(b) <= 1<<20 {
		*bp = b
		keyBuffers.Put(bp)
	}
	return key
}

var keyBuffers = sync.Pool{New: func() any { return new([]byte) }}

// CheckDeclaration screens a pinned mcp_tool node's declaration. A hard failure is a
// violation; the flags are what the node must store. An unpinned node is not screened: it
// cannot publish (CheckPin), and an import pins and screens it.
func CheckDeclaration(n *Node) (*Violation, []discovery.Finding) {
	m := n.MCPTool
	if m == nil || m.SchemaHash == "" {
		return nil, nil
	}
	v := ScreenDeclaration(m.Declaration())
	if len(v.Refusals) == 0 {
		return nil, v.Flags
	}
	return &Violation{Rule: RuleDeclaration, NodeID: n.ID, ServerRef: m.ServerRef, Message: refusalMessage(n, v.Refusals)}, v.Flags
}

// maxRefusalsShown bounds the findings one refusal message lists.
const maxRefusalsShown = 5

func refusalMessage(n *Node, refusals []discovery.Finding) string {
	m := n.MCPTool
	shown := make([]string, 0, maxRefusalsShown+1)
	for i, f := range refusals {
		if i == maxRefusalsShown {
			shown = append(shown, fmt.Sprintf("and %d more", len(refusals)-i))
			break
		}
		shown = append(shown, fmt.Sprintf("%s at %s: %s", f.Code, f.Location, f.Message))
	}
	return fmt.Sprintf("mcp_tool node %q (tool %q of server %q) pins a declaration the declaration screen refuses: %s. "+
		"It cannot be represented or used safely, so it is never stored or published, whatever its schema_hash. "+
		"Fix the declaration at the server and re-import the tool (ringfence mcp-import --server %s --tool %s), or remove the node",
		n.ID, m.ToolName, m.ServerRef, strings.Join(shown, "; "), m.ServerRef, m.ToolName)
}

// ScreenDeclarations screens every pinned mcp_tool node of a draft about to be stored. It
// refuses the first declaration the screen refuses, naming the node, the tool and each
// finding, and sets every node's flags to the screen's (an unpinned node's to none): an
// author can neither hide a flag nor invent one. Call it after VerifyPins, on a graph no one
// else reads.
func ScreenDeclarations(g *Graph) error {
	for i := range g.Nodes {
		n := &g.Nodes[i]
		if n.Kind != KindMCPTool || n.MCPTool == nil {
			continue
		}
		viol, flags := CheckDeclaration(n)
		if viol != nil {
			return fielderr.New(fmt.Sprintf("nodes[%d].mcp_tool", i), "%s", viol.Message)
		}
		n.MCPTool.Flags = slices.Clone(flags)
	}
	return nil
}

// WithScreenedFlags returns g with each listed node's flags replaced (flags by node id, as
// Result.Flags holds them). g is not changed, since it may be shared (a cached draft): a
// changed graph shares everything with g but the node slice and the changed nodes.
func WithScreenedFlags(g *Graph, flags map[string][]discovery.Finding) *Graph {
	if len(flags) == 0 {
		return g
	}
	out := *g
	out.Nodes = slices.Clone(g.Nodes)
	for i := range out.Nodes {
		n := &out.Nodes[i]
		f, ok := flags[n.ID]
		if !ok || n.MCPTool == nil {
			continue
		}
		m := *n.MCPTool
		m.Flags = slices.Clone(f)
		n.MCPTool = &m
	}
	return &out
}
