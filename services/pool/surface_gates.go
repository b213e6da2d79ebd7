package pool

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/documents"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
)

// The gates of the agent's surface (internal/agentsurface decides; docs/agents.md): the
// filter levels and deferral, tool_search, the strict form the model saw, and the documents
// a call references. They read the same decisions ListAgentTools answers from, so a listing
// and a call never disagree.

// gateSurface: the tool is one the agent's model sees now: every filter level passes it
// (filtered_out names the level), and a deferred tool was loaded by tool_search (not_loaded).
// The tool's own server's policy is the one the ceiling read: a call asks the registry once.
func gateSurface(in *gateInput, d *decision) error {
	if in.surface == nil {
		return refusal(reasonUnknownAgent, fmt.Errorf("agent %q's tools cannot be read from graph %s v%d", in.req.Agent, in.run.id.GraphID, in.run.id.Version))
	}
	if in.policy.SignIn != "" && in.connectionsErr != nil {
		return in.connectionsErr
	}
	st := agentsurface.State{Policies: map[string]mcpserver.Policy{d.serverRef: in.policy}, Selected: in.run.selected, Loaded: in.run.loaded,
		Connections: in.connections}
	dec := in.surface.DecideTool(in.req.Tool, st)
	switch dec.Outcome {
	case agentsurface.Visible:
		d.tool = dec.Tool
		return nil
	case agentsurface.FilteredOut:
		r := refusal(reasonFilteredOut, fmt.Errorf("%s is not among the tools agent %q offers its model (filter level %s): %s", in.req.Tool, in.req.Agent, dec.Level, dec.Message))
		r.Level = string(dec.Level)
		return r
	case agentsurface.NotLoaded:
		return refusal(reasonNotLoaded, errors.New(dec.Message))
	case agentsurface.SignInRequired:
		return refusal(reasonSignInRequired, errors.New(dec.Message))
	case agentsurface.NotDeclared:
		return refusal(reasonNotDeclared, errors.New(dec.Message))
	}
	return refusal(reasonUnknownTool, errors.New(dec.Message))
}

// searchAnswer is tool_search's answer: the matching tools, which the call loads.
type searchAnswer struct {
	matches []agentsurface.Match
}

// names are the binding names the answer loads.
func (a *searchAnswer) names() []string {
	out := make([]string, len(a.matches))
	for i, m := range a.matches {
		out[i] = m.Tool.Name
	}
	return out
}

// gateToolSearch answers tool_search, when the agent offers it (it has deferred servers):
// the arguments are checked against tool_search's schema as the model saw it, and the
// search runs over every tool that passes every filter now. A name the agent does not
// offer goes on to gateBinding, which refuses it (no binding may take the name).
func gateToolSearch(in *gateInput, d *decision) error {
	if in.req.Tool != graph.ToolSearchName || in.surface == nil {
		return nil
	}
	if err := in.searchPolicyErr; err != nil {
		if in.policyCanceled {
			return err
		}
		return refusal(reasonRegistryUnavailable, fmt.Errorf("the registry could not be asked for the tool filters of agent %q's servers, so tool_search cannot tell which tools it may find; nothing was loaded: %w", in.req.Agent, err))
	}
	surface := in.surface.Resolve(agentsurface.State{Policies: in.searchPolicies, Selected: in.run.selected, Loaded: in.run.loaded})
	dec := surface.Decide(graph.ToolSearchName)
	if dec.Outcome != agentsurface.MetaTool {
		return nil
	}
	if in.args.err != nil {
		return in.args.err
	}
	d.args = in.args
	spec := formSpec(graph.ToolSearchName, dec.Tool.InputSchema)
	if err := gateRefusal(mcpgate.Check(spec, in.args.value, mcpgate.Capabilities{}, mcpgate.WithSchemaCache(in.schemas)), "tool_search's schema is the pool's own: report this"); err != nil {
		return err
	}
	// A null server (the strict form makes it nullable) is no server, as an absent one.
	query, _ := in.args.value["query"].(string)
	server, _ := in.args.value["server"].(string)
	d.search = &searchAnswer{matches: surface.Search(query, server, 0)}
	d.answered = true
	return nil
}

// gateConnect answers a call to a server's connect tool, when the agent offers it (the server
// signs each user in and the run's user has not connected it): callTool connects it
// (answerConnect). A name the agent does not offer goes on to gateBinding, which refuses it.
func gateConnect(in *gateInput, d *decision) error {
	ref, ok := strings.CutPrefix(in.req.Tool, graph.ConnectToolPrefix)
	if !ok || in.surface == nil {
		return nil
	}
	if err := in.connectPolicyErr; err != nil {
		if in.policyCanceled {
			return err
		}
		return refusal(reasonRegistryUnavailable, fmt.Errorf("the registry could not be asked for server %q's policy, so its connect tool cannot be decided: %w", ref, err))
	}
	if in.connectPolicy == nil {
		return nil
	}
	if in.connectionsErr != nil {
		return in.connectionsErr
	}
	surface := in.surface.Resolve(agentsurface.State{Policies: map[string]mcpserver.Policy{ref: *in.connectPolicy}, Selected: in.run.selected,
		Loaded: in.run.loaded, Connections: in.connections})
	if dec := surface.Decide(in.req.Tool); dec.Outcome != agentsurface.MetaTool {
		return nil
	}
	d.connect, d.serverRef, d.answered = ref, ref, true
	d.attempt.ServerRef = ref
	return nil
}

// formSpec is a schema the model was shown (a strict form, tool_search's), as mcpgate checks
// arguments against it. Its pin is a hash of the schema alone, apart from every declaration's
// (whose pins hash name, description and more), so the schema cache keeps the two apart. Only
// the arguments' form is checked with it: it needs no permission (the call's own gates do).
func formSpec(name string, schema json.RawMessage) *mcpgate.ToolSpec {
	sum := sha256.Sum256(append([]byte("ringfence agent surface form\x00"), schema...))
	return &mcpgate.ToolSpec{Namespace: mcpgate.Namespace, Name: name, Version: mcpgate.Version, InputSchema: schema,
		Pin: mcpdecl.HashPrefix + hex.EncodeToString(sum[:]), NoPermissionNeeded: true}
}

// gateStrict: with convert_schemas_to_strict the model writes arguments to the strict form,
// so they are checked against it; then the nulls that stand for omitted optional properties
// are taken out, since the server declared the original schema, which gateCall checks next.
func gateStrict(in *gateInput, d *decision) error {
	t := d.tool
	if t == nil || !t.Strict {
		return nil
	}
	err := gateRefusal(mcpgate.Check(formSpec(t.ToolName, t.InputSchema), d.args.value, mcpgate.Capabilities{}, mcpgate.WithSchemaCache(in.schemas)), reimport)
	var ref *RefusedError
	if errors.As(err, &ref) && ref.Reason == reasonInvalidInput {
		ref.Err = fmt.Errorf("%w (checked against the strict form the agent's model sees: convert_schemas_to_strict)", ref.Err)
	}
	if err != nil {
		return err
	}
	args, uerr := agentsurface.Unstrict(d.target.node.MCPTool.InputSchema, cloneArgs(d.args.value))
	if uerr != nil {
		return refusal(reasonUnusableSchema, fmt.Errorf("the pinned input schema of %s cannot be read: %v; %s", in.req.Tool, uerr, reimport))
	}
	d.args.value = args
	return nil
}

// cloneArgs copies a call's arguments deeply, so a gate that changes them leaves the input
// as it came.
func cloneArgs(args map[string]any) map[string]any { return documents.Substitute(args, nil) }

// gateDocumentRefs: in a call to a server the agent's document_resolver lists, the
// my-documents:// references of the arguments, which callTool fetches; elsewhere a reference
// is a string like any other and stays as written.
func gateDocumentRefs(_ *gateInput, d *decision) error {
	res := d.target.agent.ToolSettings.DocumentResolver
	if res == nil || !res.Enabled || !slices.Contains(res.ServerNames, d.serverRef) {
		return nil
	}
	ids, err := documents.Refs(d.args.value)
	if err != nil {
		return refusal(reasonDocumentUnavailable, err)
	}
	d.docRefs = ids
	return nil
}

// gateDocuments: every referenced document was fetched, and its content (base64) replaces
// the reference in the arguments the server gets and the schemas check. The arguments as
// written, and their digest, keep the reference.
func gateDocuments(in *gateInput, d *decision) error {
	if len(d.docRefs) == 0 {
		return nil
	}
	contents := make(map[string][]byte, len(d.docRefs))
	for _, id := range d.docRefs {
		f, ok := in.documents[id]
		switch {
		case !ok:
			return refusal(reasonDocumentUnavailable, fmt.Errorf("%s%s was not fetched", documents.Scheme, id))
		case errors.Is(f.err, context.Canceled) || errors.Is(f.err, context.DeadlineExceeded):
			return f.err
		case f.err != nil:
			return refusal(reasonDocumentUnavailable, fmt.Errorf("%s%s: %w", documents.Scheme, id, f.err))
		}
		contents[id] = f.content
	}
	d.args.value = documents.Substitute(d.args.value, contents)
	return nil
}
