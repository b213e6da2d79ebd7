package pool

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/ident"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/internal/peers"
	"github.com/ringfence/ringfence/mcpgate"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// DiscoverTools starts a registered server in isolation, takes its whole tool listing, stops
// it, and returns every tool with its pin, the screen's findings and whether the registration's
// tool filter excludes it. Every failure is a *discovery.Failure with a class, or
// discovery.ErrIsolationRequired; no container outlives the call.
func (s *Service) DiscoverTools(ctx context.Context, ref string) (*discovery.Listing, error) {
	listing, _, err := s.ExploreTools(ctx, discovery.ExploreRequest{Ref: ref})
	return listing, err
}

// specFor turns a resolved registration into what the spawner starts.
func specFor(reg *mcpserver.Resolved, purpose, runID string) spawner.Spec {
	return spawner.Spec{
		ServerRef:        reg.Ref,
		Transport:        reg.Transport,
		Command:          reg.Command,
		Args:             reg.Args,
		Env:              reg.Env,
		URL:              reg.URL,
		Headers:          reg.HeaderValues,
		HandshakeTimeout: reg.SessionTimeout(),
		Purpose:          purpose,
		RunID:            runID,
		MaxResultBytes:   int(reg.ResultCap()),
	}
}

// serverText makes text a server chose fit to show; spawner.Session implements it.
type serverText interface {
	// SafeText cleans server-chosen text for a message.
	SafeText(string) string
	// Redact masks the registration's secrets.
	Redact(string) string
}

// Screen pins and screens a live listing under a registration. The pin covers the raw
// declaration; screening never changes it. A declaration holding a secret's value is shown
// with the value masked and hard-fails, so it can never be pinned.
func Screen(reg *mcpserver.Resolved, tools []*mcp.Tool, text serverText) (*discovery.Listing, error) {
	decls := make([]mcpdecl.Declaration, 0, len(tools))
	for _, t := range tools {
		d, err := mcpdecl.FromTool(t)
		if err != nil {
			return nil, &discovery.Failure{Class: string(spawner.ClassProtocolViolation), Message: fmt.Sprintf("tool %s cannot be read: %v", text.SafeText(truncate(t.Name)), err)}
		}
		decls = append(decls, d)
	}
	report := screen.Screen(decls, screen.Context{})
	listing := &discovery.Listing{ServerRef: reg.Ref, Revision: reg.Revision, Findings: discovery.FromScreen(report.Listing)}
	for i, d := range decls {
		tool := discovery.Tool{
			Findings: discovery.FromScreen(report.Tools[i].Findings),
			Excluded: !reg.Filter.Allows(d.Name),
		}
		if h, err := mcpdecl.Hash(d); err == nil {
			tool.SchemaHash = h
		}
		if shown := redactDeclaration(d, text.Redact); !reflect.DeepEqual(shown, d) {
			d = shown
			tool.Findings = append(tool.Findings, discovery.Finding{Code: screen.CodeSecretInDeclaration, Severity: discovery.SeverityHardFailure,
				Message: "the declaration contains the value of one of the registration's env or header secrets (masked here): every agent shown the tool would read it; the server must not put secrets in its declarations"})
		}
		tool.Name, tool.Title, tool.Description = d.Name, d.Title, d.Description
		tool.InputSchema, tool.OutputSchema, tool.Annotations = d.InputSchema, d.OutputSchema, d.Annotations
		listing.Tools = append(listing.Tools, tool)
	}
	return listing, nil
}

// redactDeclaration is d with every secret masked. Masking inside the JSON of a schema keeps
// it JSON: the mask has no character JSON escapes.
func redactDeclaration(d mcpdecl.Declaration, redact func(string) string) mcpdecl.Declaration {
	raw := func(r json.RawMessage) json.RawMessage {
		if len(r) == 0 {
			return r
		}
		if m := redact(string(r)); m != string(r) {
			return json.RawMessage(m)
		}
		return r
	}
	return mcpdecl.Declaration{
		Name: redact(d.Name), Title: redact(d.Title), Description: redact(d.Description),
		InputSchema: raw(d.InputSchema), OutputSchema: raw(d.OutputSchema), Annotations: raw(d.Annotations),
	}
}

// spawnFailure turns a spawner error into the classified discovery failure callers see.
func spawnFailure(err error) error {
	var se *spawner.Error
	if !errors.As(err, &se) {
		return err // context errors pass through
	}
	if se.Class == spawner.ClassIsolationRequired {
		return discovery.ErrIsolationRequired
	}
	return &discovery.Failure{Class: string(se.Class), Message: se.Message, StderrTail: se.StderrTail}
}

func truncate(s string) string { return truncateTo(s, 64) }

// truncateTo bounds s to n bytes, cutting at a character boundary.
func truncateTo(s string, n int) string { return humanize.Cut(s, n, "...") }

// hardFailures names the screen's hard failures of a live declaration (and of its listing).
func hardFailures(fs ...[]discovery.Finding) []string {
	var out []string
	for _, list := range fs {
		for _, f := range list {
			if f.Severity == discovery.SeverityHardFailure {
				out = append(out, fmt.Sprintf("%s at %s: %s", f.Code, f.Location, f.Message))
			}
		}
	}
	return out
}

// screenRefusal refuses a tool whose live declaration the screen hard-fails, naming the
// findings. A pinned tool passed the screen at import; a live one (explore, the inline path)
// is screened here, before anything reaches the server.
func screenRefusal(ref string, tool discovery.Tool, listing []discovery.Finding, safe func(string) string) error {
	hard := hardFailures(tool.Findings, listing)
	if len(hard) == 0 {
		return nil
	}
	return refusal(reasonDeclarationScreen, fmt.Errorf("the declaration screen refuses the live declaration of tool %s on %s: %s; no call reaches it until the server declares it safely",
		safe(truncate(tool.Name)), ref, safe(strings.Join(hard, "; "))))
}

// ExploreTools is DiscoverTools with, when req.Call is set, one call of a listed tool on the
// same isolated session, outside any run: for an operator trying a server. The call passes
// the gates that exist outside a run (the audit spool has room, the tool is listed and not
// filtered out, the arguments match its live input schema), is dispatched, checked and
// sanitized as a run's calls are, and is recorded in the audit log as a tool-call attempt of a
// run named explore-…, whose agent is the operator's key, under the call id the caller chose
// (req.Call.CallId) or, without one, one the pool makes. A refused or failed call still
// answers with the listing; the result says what happened.
func (s *Service) ExploreTools(ctx context.Context, req discovery.ExploreRequest) (*discovery.Listing, *typesv1.ExploreCallResult, error) {
	if req.Call != nil {
		// The tool's name lands in the call's audit record, which must be able to hold it.
		if err := boundedField("call.tool", req.Call.GetTool(), true); err != nil {
			return nil, nil, err
		}
		// A caller-chosen id names the call's records before any answer does; it is a call id
		// as CallTool takes one.
		if id := req.Call.GetCallId(); id != "" {
			if err := ident.CallID.Check("call.call_id", id); err != nil {
				return nil, nil, err
			}
		}
		if err := s.spool.CanAccept(); err != nil {
			return nil, nil, err // nothing starts without room for its record
		}
	}
	var reg *mcpserver.Resolved
	if req.Adhoc != nil {
		reg = peers.ResolvedFromProto(req.Adhoc)
	} else {
		var err error
		if reg, err = s.cfg.Registry.ResolveRegistration(ctx, req.Ref); err != nil {
			return nil, nil, err
		}
	}
	if reg.OAuth != nil {
		return s.exploreAs(ctx, req, reg)
	}
	spawned, err := s.spawner.Spawn(ctx, specFor(reg, spawner.PurposeDiscovery, ""))
	if err != nil {
		return nil, nil, spawnFailure(err)
	}
	// A failure to stop is the spawner's to log and the sweep's to clean up; the listing stands.
	defer func() { _ = spawned.Close(context.WithoutCancel(ctx)) }()
	// The listing is part of client setup: bounded by client_session_timeout.
	tools, err := spawned.SetupListTools(ctx)
	if err != nil {
		return nil, nil, spawnFailure(err)
	}
	listing, err := Screen(reg, tools, spawned)
	if err != nil {
		return nil, nil, err
	}
	if req.Call == nil {
		return listing, nil, nil
	}
	sess := &session{ref: reg.Ref, sess: spawned, reg: reg, start: time.Now()}
	return listing, s.exploreCall(ctx, sess, listing, req), nil
}

// exploreAs lists the tools of a server that signs each user in: they are each user's, listed
// with a user's token (an import for that user), never by an operator's discovery, which has
// none, and never called outside a run.
func (s *Service) exploreAs(ctx context.Context, req discovery.ExploreRequest, reg *mcpserver.Resolved) (*discovery.Listing, *typesv1.ExploreCallResult, error) {
	signIn := func(format string, args ...any) error {
		return &discovery.Failure{Class: discovery.ClassSignInRequired, Message: fmt.Sprintf(format, args...)}
	}
	switch {
	case req.User == "":
		return nil, nil, signIn("server %s signs each user in, so its tools are listed per user: connect it for a user (ringfence servers connect %s --user U), and import as that user (ringfence mcp-import --user U)", reg.Ref, reg.Ref)
	case req.Call != nil || req.Adhoc != nil:
		return nil, nil, signIn("server %s signs each user in: it is explored with no call and no ad hoc spec; its tools are called in that user's runs", reg.Ref)
	case ValidateUser("user", req.User) != nil:
		return nil, nil, ValidateUser("user", req.User)
	}
	if err := s.signInConfigured(); err != nil {
		return nil, nil, err
	}
	listing, err := s.listAs(ctx, orDefaultTenant(req.Tenant), req.User, reg)
	if errors.Is(err, errSignInRequired) {
		return nil, nil, signIn("user %s has not connected server %s (%s): ringfence servers connect %s --user %s", req.User, reg.Ref, signInWhy(err), reg.Ref, req.User)
	}
	if errors.Is(err, errServerUnreachable) {
		return nil, nil, &discovery.Failure{Class: discovery.ClassSpawnFailed, Message: strings.TrimPrefix(err.Error(), "pool: ")}
	}
	return listing, nil, err
}

// exploreCall makes, checks and records the one call of ExploreTools.
func (s *Service) exploreCall(ctx context.Context, sess *session, listing *discovery.Listing, req discovery.ExploreRequest) *typesv1.ExploreCallResult {
	start := time.Now()
	out := &typesv1.ExploreCallResult{CallId: req.Call.GetCallId()}
	if out.CallId == "" {
		out.CallId = "call-" + newRunID()[4:]
	}
	att := audit.ToolCallAttempt{
		RunID: "explore-" + newRunID()[4:], CallID: out.CallId, Attempt: 1,
		AgentNode: req.Actor, ServerRef: sess.reg.Ref, ToolName: req.Call.GetTool(),
	}
	if att.AgentNode == "" || audit.FieldProblem(att.AgentNode, true) != "" {
		// A peer that sends no label (an older registry), or one the log would refuse.
		att.AgentNode = "operator:" + orDash(req.ActorKeyID)
	}
	var argsCanonical []byte
	res, err := func() (*CallResult, error) {
		i := slices.IndexFunc(listing.Tools, func(t discovery.Tool) bool { return t.Name == req.Call.GetTool() })
		if i < 0 {
			return nil, refusal(reasonUnknownTool, fmt.Errorf("server %q lists no tool named %q", sess.reg.Ref, truncate(req.Call.GetTool())))
		}
		live := listing.Tools[i]
		att.LiveHash = live.SchemaHash
		if live.Excluded {
			return nil, refusal(reasonCeiling, fmt.Errorf("the registration's tool_filter excludes %q: no call reaches it", live.Name))
		}
		if err := screenRefusal(sess.reg.Ref, live, listing.Findings, sess.sess.SafeText); err != nil {
			return nil, err
		}
		// An operator's call (mcp:admin, checked by the registry): no capability applies.
		spec := &mcpgate.ToolSpec{Namespace: mcpgate.Namespace, Name: live.Name, Version: mcpgate.Version, InputSchema: live.InputSchema, OutputSchema: live.OutputSchema, Pin: live.SchemaHash, NoPermissionNeeded: true}
		var raw json.RawMessage
		if a := req.Call.GetArguments(); a != nil {
			b, err := a.MarshalJSON()
			if err != nil {
				return nil, refusal(reasonInvalidInput, fmt.Errorf("arguments cannot be encoded as JSON: %v", err))
			}
			raw = b
		}
		args, canonical, err := decodeArguments(raw)
		if err != nil {
			return nil, err
		}
		argsCanonical = canonical
		// The live schemas compile and accept the arguments, read strictly when the
		// registration asks.
		check := mcpgate.Check(spec, args, mcpgate.Capabilities{}, mcpgate.WithStrictInputs(sess.reg.StrictInputs),
			mcpgate.WithSchemaCache(s.schemas), mcpgate.WithSafeText(sess.sess.SafeText))
		if err := gateRefusal(check, fixServer); err != nil {
			return nil, err
		}
		// On record before anything reaches the server, as a run's calls are.
		if err := s.admit(ctx, sess); err != nil {
			return nil, err
		}
		if err = s.recordPending(ctx, &att, argsCanonical, req.Tenant); err != nil {
			return nil, err
		}
		d := decision{attempt: att, spec: spec, serverRef: sess.reg.Ref, args: arguments{value: args, canonical: canonical}}
		return s.dispatch(ctx, sess, d, out.CallId)
	}()
	att.LatencyMicros = time.Since(start).Microseconds()
	setArgs(&att, argsCanonical)
	settle(&att, res, err)
	out.Outcome, out.Reason, out.Result, out.FailureClass = att.Outcome, att.Reason, att.Result, att.FailureClass
	if err != nil {
		out.Message = err.Error()
		var refused *RefusedError
		if errors.As(err, &refused) {
			out.Message = refused.Problem()
		}
	} else {
		out.IsError, out.ResultDigest, out.ResultSize = res.IsError, att.ResultDigest, att.ResultSize
		out.Content, out.StructuredContent = resultToProto(res)
	}
	if aerr := s.spool.Enqueue(context.WithoutCancel(ctx), audit.NewToolCallRecord("pool", orDefaultTenant(req.Tenant), att)); aerr != nil {
		// A dispatched call's pending record stands and says it may have taken effect; a
		// refusal would be nowhere, so the caller is told.
		s.log.Error("an explore call's outcome could not be recorded in the audit spool", "server", sess.reg.Ref, "call", out.CallId, "err", aerr)
		if att.Outcome == audit.OutcomeRefusedBeforeDispatch {
			out.Message += fmt.Sprintf("; this attempt could not be recorded in the audit log: %v", aerr)
		}
	}
	return out
}
