package pool

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/internal/agentsurface"
	"github.com/ringfence/ringfence/internal/graph"
	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/services/pool/spawner"
)

// agentServer is the MCP server of one agent of one run: the SDK's mcp.Server, whose tools
// are the agent's listing (ListAgentTools) as of its last refresh, every one handled by
// handleCall, which is CallTool. Clients of every token of that agent share it, so a change
// of the listing (tool_search loaded tools, an operator changed a filter) reaches each of
// their sessions as notifications/tools/list_changed.
type agentServer struct {
	fd     *FrontDoor
	key    agentKey
	server *mcp.Server

	// mu serializes refreshes; tools holds each listed tool's declaration as added, to add
	// only what changed (the SDK announces every AddTool to every session).
	mu     sync.Mutex
	synced time.Time
	tools  map[string]listedTool

	usedMu sync.Mutex
	used   time.Time
	// uses is each stateful session's (by id) last request and how many are in flight.
	uses map[string]*sessionUse
	// last is the token of the last request: what a refresh no request asked for acts as
	// (on another host than the run's owner, the listing is the owner's to give).
	last *AgentToken
}

// listedTool is a tool as the agent server added it, and its declaration's JSON.
type listedTool struct {
	tool *mcp.Tool
	decl []byte
}

func newAgentServer(f *FrontDoor, k agentKey) *agentServer {
	a := &agentServer{fd: f, key: k, tools: make(map[string]listedTool), uses: make(map[string]*sessionUse)}
	a.server = mcp.NewServer(&mcp.Implementation{Name: "ringfence", Title: "Ringfence: agent " + k.agent + " of run " + k.run, Version: "1"},
		&mcp.ServerOptions{
			Instructions: fmt.Sprintf("The tools of agent %s in run %s, governed by Ringfence: every call passes its gates and is recorded in the audit log.", k.agent, k.run),
			// Ringfence governs tools: prompts and resources are declared, and listed empty,
			// so a client asking for them learns there are none. Logging is declared (deprecated
			// in 2026-07-28, still served) so that clients of earlier versions which send
			// logging/setLevel get an answer rather than an error.
			Capabilities: &mcp.ServerCapabilities{Logging: &mcp.LoggingCapabilities{}, Tools: &mcp.ToolCapabilities{ListChanged: true}, //nolint:staticcheck // SA1019: see above

				Prompts: &mcp.PromptCapabilities{}, Resources: &mcp.ResourceCapabilities{}},
			SetCacheable: a.cacheable,
			Logger:       f.sdkLog,
		})
	a.server.AddReceivingMiddleware(a.middleware)
	return a
}

func (a *agentServer) touch(t *AgentToken) {
	a.usedMu.Lock()
	a.used, a.last = time.Now(), t
	a.usedMu.Unlock()
}

// unasked is the context of a refresh no request asked for: acting for the last request's
// token.
func (a *agentServer) unasked() context.Context {
	a.usedMu.Lock()
	t := a.last
	a.usedMu.Unlock()
	if t == nil {
		return context.Background()
	}
	return actingFor(context.Background(), t)
}

// idle says the server has no session and was not used for longer than d: it can go (a new
// request makes it again).
func (a *agentServer) idle(now time.Time, d time.Duration) bool {
	a.usedMu.Lock()
	used := a.used
	a.usedMu.Unlock()
	return now.Sub(used) > d && a.sessions() == 0
}

// sessionUse is a session's last request and how many of its requests are in flight.
type sessionUse struct {
	last     time.Time
	inflight int
}

// using notes that session id began (d 1) or ended (d -1) a request.
func (a *agentServer) using(id string, d int) {
	a.usedMu.Lock()
	defer a.usedMu.Unlock()
	u := a.uses[id]
	if u == nil {
		if d < 0 {
			return // forgotten with its session
		}
		u = &sessionUse{}
		a.uses[id] = u
	}
	u.last = a.fd.now()
	u.inflight += d
}

// admit says whether a new session of the agent may open: when the agent has fewer than max,
// or when its least recently used session with no request in flight sent nothing since
// idleBefore, which admit closes for it (its client, if it comes back, is told the session is
// not found, 404, and opens a new one). It forgets the use of sessions that are gone.
func (a *agentServer) admit(max int, idleBefore time.Time) bool {
	var oldest *mcp.ServerSession
	var oldestUse time.Time
	live := map[string]bool{}
	a.usedMu.Lock()
	n := 0
	for ss := range a.server.Sessions() {
		n++
		id := ss.ID()
		if id == "" {
			continue
		}
		live[id] = true
		u := a.uses[id]
		if u == nil {
			u = &sessionUse{} // opened, not used yet
		}
		if u.inflight == 0 && (oldest == nil || u.last.Before(oldestUse)) {
			oldest, oldestUse = ss, u.last
		}
	}
	for id := range a.uses {
		if !live[id] {
			delete(a.uses, id)
		}
	}
	if n < max {
		a.usedMu.Unlock()
		return true
	}
	if oldest == nil || !oldestUse.Before(idleBefore) {
		a.usedMu.Unlock()
		return false
	}
	delete(a.uses, oldest.ID())
	a.usedMu.Unlock()
	a.fd.log.Info("closed the least recently used session of an agent that has the most sessions it may, for a new one", "run", a.key.run, "agent", a.key.agent, "last_request", oldestUse)
	_ = oldest.Close()
	return true
}

func (a *agentServer) sessions() int {
	n := 0
	for range a.server.Sessions() {
		n++
	}
	return n
}

// cacheable: a listing is this token's agent's alone (private), fresh for the list TTL.
func (a *agentServer) cacheable(_ context.Context, req mcp.Request, c *mcp.Cacheable) {
	if _, ok := req.(*mcp.ListToolsRequest); ok {
		c.TTLMs = int(a.fd.cfg.ListTTL.Milliseconds())
		c.CacheScope = "private"
	}
}

// middleware refreshes the listing before tools/list and tools/call, and sends a call to a
// name the listing does not show to the pool all the same, so that its refusal is on record;
// the client gets it as MCP answers an unknown tool.
func (a *agentServer) middleware(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && ss.ID() != "" && !strings.HasPrefix(method, "notifications/") {
			// A request, which the client waits for (a notification may be handled after
			// the client went on).
			a.using(ss.ID(), 1)
			defer a.using(ss.ID(), -1)
		}
		if ss, ok := req.GetSession().(*mcp.ServerSession); ok && (ss.ID() != "" || method == "subscriptions/listen") {
			// A session that can be told of changes: it hears those made on another host too.
			a.fd.follow(a.key)
		}
		switch method {
		case "tools/list":
			if err := a.refresh(ctx, false); err != nil {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: "the agent's tools cannot be listed now: " + unprefixed(err)}
			}
		case "tools/call":
			call, ok := req.(*mcp.CallToolRequest)
			if !ok || call.Params == nil {
				break
			}
			if err := a.refresh(ctx, false); err != nil {
				a.fd.log.Warn("the agent's listing could not be refreshed before a call; the pool decides the call all the same", "run", a.key.run, "agent", a.key.agent, "err", err)
			}
			if !a.listed(call.Params.Name) {
				return nil, a.unlisted(ctx, call)
			}
		}
		return next(ctx, method, req)
	}
}

func (a *agentServer) listed(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.tools[name]
	return ok
}

// unlisted calls a name the listing does not show: the pool refuses it (unknown_tool,
// filtered_out, not_loaded, ...) and records the refusal; the client gets it as an unknown
// tool's JSON-RPC error (-32602), whose message is the refusal and whose data is the refusal's
// _meta (its reason and gate, and the call_id and attempt that find its audit record).
func (a *agentServer) unlisted(ctx context.Context, call *mcp.CallToolRequest) error {
	res, err := a.call(ctx, call)
	msg := fmt.Sprintf("unknown tool %q", call.Params.Name)
	var data json.RawMessage
	switch {
	case err != nil:
		msg += ": " + err.Error()
	case res != nil && res.IsError:
		var b bytes.Buffer
		for _, c := range res.Content {
			if t, ok := c.(*mcp.TextContent); ok {
				b.WriteString(t.Text)
			}
		}
		msg += ": " + b.String()
		if len(res.Meta) > 0 {
			data, _ = json.Marshal(res.Meta)
		}
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: msg, Data: data}
}

// refresh makes the server's tools the agent's listing when it is older than the list TTL,
// or now when force is set: tools gone are removed, new or changed ones added, each change
// announced to the sessions (list_changed) by the SDK.
func (a *agentServer) refresh(ctx context.Context, force bool) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !force && time.Since(a.synced) < a.fd.cfg.ListTTL {
		return nil
	}
	l, err := a.fd.svc.ListAgentTools(ctx, a.key.run, a.key.tenant, a.key.agent)
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(l.Tools))
	for i := range l.Tools {
		t, err := mcpTool(&l.Tools[i])
		if err != nil {
			a.fd.log.Warn("a tool of the agent cannot be listed over MCP", "run", a.key.run, "agent", a.key.agent, "tool", l.Tools[i].Name, "err", err)
			continue
		}
		want[t.Name] = true
		decl, _ := json.Marshal(t)
		if bytes.Equal(decl, a.tools[t.Name].decl) {
			continue
		}
		if err := addTool(a.server, t, a.handleCall); err != nil {
			a.fd.log.Warn("a tool of the agent cannot be listed over MCP", "run", a.key.run, "agent", a.key.agent, "tool", t.Name, "err", err)
			continue
		}
		a.tools[t.Name] = listedTool{tool: t, decl: decl}
	}
	var gone []string
	for name := range a.tools {
		if !want[name] {
			gone = append(gone, name)
			delete(a.tools, name)
		}
	}
	if len(gone) > 0 {
		a.server.RemoveTools(gone...)
	}
	a.synced = time.Now()
	return nil
}

// fill reads the listing of a server that never read it.
func (a *agentServer) fill(ctx context.Context) error {
	a.mu.Lock()
	filled := !a.synced.IsZero()
	a.mu.Unlock()
	if filled {
		return nil
	}
	return a.refresh(ctx, false)
}

// announce reads the agent's listing again, which tells its clients of what changed in it,
// and, when ref names a server the agent lists tools of, that its tools changed: the SDK
// announces a tool added again as a change.
func (a *agentServer) announce(ref string) {
	if err := a.refresh(a.unasked(), true); err != nil {
		a.fd.log.Warn("the agent's listing could not be refreshed after it changed", "run", a.key.run, "agent", a.key.agent, "err", err)
	}
	if ref == "" {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, lt := range a.tools {
		if lt.tool.Meta["io.ringfence/server"] == ref {
			_ = addTool(a.server, lt.tool, a.handleCall)
			return
		}
	}
}

// addTool adds t, turning the SDK's panic on a declaration it cannot serve (an input schema
// that is not an object) into an error: the pinned declaration is a server's, not ours.
func addTool(s *mcp.Server, t *mcp.Tool, h mcp.ToolHandler) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	s.AddTool(t, h)
	return nil
}

// mcpTool is a listing entry as MCP declares a tool: the pinned declaration (its input
// schema strict where the agent says so) under the name the agent calls it by.
func mcpTool(t *agentsurface.Tool) (*mcp.Tool, error) {
	out := &mcp.Tool{Name: t.Name, Title: t.Title, Description: t.Description, InputSchema: t.InputSchema}
	if len(t.InputSchema) == 0 {
		out.InputSchema = json.RawMessage(`{"type":"object"}`)
	}
	if len(t.OutputSchema) > 0 {
		out.OutputSchema = t.OutputSchema
	}
	if len(t.Annotations) > 0 {
		var ann mcp.ToolAnnotations
		if err := json.Unmarshal(t.Annotations, &ann); err != nil {
			return nil, fmt.Errorf("its annotations cannot be read: %v", err)
		}
		out.Annotations = &ann
	}
	meta := mcp.Meta{"io.ringfence/kind": t.Kind}
	if t.ServerRef != "" {
		meta["io.ringfence/server"] = t.ServerRef
	}
	if t.RequiresConfirmation {
		meta["io.ringfence/requires_confirmation"] = true
	}
	out.Meta = meta
	return out, nil
}

// handleCall is every listed tool's handler: the call goes to CallTool, and what it comes to
// goes back as an MCP result.
func (a *agentServer) handleCall(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	return a.call(ctx, req)
}

// call makes one tools/call a CallTool of the token's agent, relaying the server's progress
// to the client when it asked for it. A call that asks a person first is put to the client's
// user when the client can be asked; refusals and failures are tool errors.
func (a *agentServer) call(ctx context.Context, req *mcp.CallToolRequest) (*mcp.CallToolResult, error) {
	tok, ok := tokenFrom(ctx)
	if !ok {
		return nil, errors.New("the call carries no agent token")
	}
	c := CallRequest{RunID: tok.RunID, Tenant: tok.Tenant, Agent: tok.Agent, Tool: req.Params.Name, Arguments: req.Params.Arguments, AgentTokenID: tok.ID}
	if token := req.Params.GetProgressToken(); token != nil && req.Session != nil {
		session := req.Session
		ctx = spawner.WithProgress(ctx, func(p spawner.Progress) {
			_ = session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token, Progress: p.Progress, Total: p.Total, Message: p.Message})
		})
	}
	res, err := a.fd.svc.CallTool(ctx, c)
	var ref *RefusedError
	if errors.As(err, &ref) && ref.Reason == reasonApprovalRequired && ref.ApprovalID != "" {
		return a.approval(ctx, req, c, tok, ref)
	}
	if a.loaded(res) {
		// tool_search loaded tools: the sessions hear of them (list_changed) now, not after
		// the list TTL.
		if rerr := a.refresh(context.WithoutCancel(ctx), true); rerr != nil {
			a.fd.log.Warn("the agent's listing could not be refreshed after tool_search", "run", tok.RunID, "agent", tok.Agent, "err", rerr)
		}
	}
	return callResult(res, err)
}

// loaded says res is tool_search's answer.
func (a *agentServer) loaded(res *CallResult) bool {
	return res != nil && (res.ServerRef == "" && res.ToolName == agentsurface.KindToolSearch ||
		strings.HasPrefix(res.ToolName, graph.ConnectToolPrefix))
}

// The key of the approval question among a result's input requests.
const approvalInputKey = "ringfence_approval"

// approval answers a call that waits for approval ref: with the client user's answer to the
// question it was asked (the retry carries it), by approving or denying the call as that user
// and handing on what the retry of the call gets; else by asking the question, when the client
// can be asked; else by a tool error naming the approval and the command that decides it.
func (a *agentServer) approval(ctx context.Context, req *mcp.CallToolRequest, c CallRequest, tok *AgentToken, ref *RefusedError) (*mcp.CallToolResult, error) {
	canAsk := a.fd.cfg.ClientApprovals && canElicit(req)
	if canAsk {
		if answer, ok := a.approvalAnswer(req, tok, ref.ApprovalID); ok {
			switch answer.Action {
			case "accept":
				return a.approve(ctx, c, tok, ref)
			case "decline":
				if _, err := a.fd.svc.DenyCall(ctx, tok.RunID, tok.Tenant, ref.ApprovalID, approverName(tok), "declined by the user in the MCP client"); err != nil {
					a.fd.log.Warn("a denial given in the MCP client could not be recorded", "run", tok.RunID, "approval", ref.ApprovalID, "err", err)
				}
				return callResult(a.fd.svc.CallTool(ctx, c))
			}
			// cancel: the user did not decide; the call waits as for any other client.
			return callResult(nil, ref)
		}
		return &mcp.CallToolResult{
			InputRequests: mcp.InputRequestMap{approvalInputKey: &mcp.ElicitParams{
				Mode:            "form",
				Message:         approvalQuestion(c, ref),
				RequestedSchema: map[string]any{"type": "object", "properties": map[string]any{}},
			}},
			RequestState: a.approvalState(tok, ref.ApprovalID),
		}, nil
	}
	return callResult(nil, ref)
}

// approve approves the call as the client's user, then hands on the outcome the retry of the
// same call gets (once): the result, or how it failed. A gate that refuses the call now (a
// grant taken away meanwhile) answers with that refusal.
func (a *agentServer) approve(ctx context.Context, c CallRequest, tok *AgentToken, ref *RefusedError) (*mcp.CallToolResult, error) {
	_, direct, err := a.fd.svc.ApproveCall(ctx, tok.RunID, tok.Tenant, ref.ApprovalID, approverName(tok))
	var refused *RefusedError
	if errors.As(err, &refused) {
		return callResult(nil, refused)
	}
	res, err := a.fd.svc.CallTool(ctx, c)
	var failed *FailedError
	if errors.As(err, &failed) && failed.Class == failureResultNotKept && direct != nil {
		return callResult(direct, nil)
	}
	return callResult(res, err)
}

// approverName is how an approval given in the MCP client is recorded: as the user's, the one
// at the client of this token's agent and run.
func approverName(tok *AgentToken) string {
	return fmt.Sprintf("user via the MCP front door (run %s, agent %s, token %s)", tok.RunID, tok.Agent, tok.ID)
}

// canElicit says the client can be asked: it declares form elicitation (on 2026-07-28, per
// request; earlier, at initialize, on a session that can carry the question).
func canElicit(req *mcp.CallToolRequest) bool {
	caps := req.ClientCapabilities()
	if caps == nil || caps.Elicitation == nil {
		return false
	}
	// No mode named is form, as before modes existed; a client of URL mode alone cannot
	// answer a form.
	e := caps.Elicitation
	return e.Form != nil || e.URL == nil
}

// maxQuestionArgs bounds the arguments quoted in an approval question.
const maxQuestionArgs = 2048

// approvalQuestion is what the client's user is asked.
func approvalQuestion(c CallRequest, ref *RefusedError) string {
	args := string(c.Arguments)
	if args == "" {
		args = "{}"
	}
	if len(args) > maxQuestionArgs {
		args = args[:maxQuestionArgs] + fmt.Sprintf("… (%s in all)", humanize.Bytes(int64(len(c.Arguments))))
	}
	return fmt.Sprintf("Agent %s of run %s asks to call %s with these arguments:\n%s\nAccept to approve this call (approval %s), decline to deny it.", c.Agent, c.RunID, c.Tool, args, ref.ApprovalID)
}

// approvalState is the request state the client echoes with its answer: the approval it
// answers, signed for this token, so an answer cannot be moved to another approval or token.
func (a *agentServer) approvalState(tok *AgentToken, approvalID string) string {
	m := hmac.New(sha256.New, a.fd.stateKey)
	m.Write([]byte(tok.ID + "\x00" + approvalID))
	return approvalID + "." + base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// approvalAnswer is the client user's answer to the question about approvalID, when the
// request carries one with a state signed for this token and approval.
func (a *agentServer) approvalAnswer(req *mcp.CallToolRequest, tok *AgentToken, approvalID string) (*mcp.ElicitResult, bool) {
	p := req.Params
	if len(p.InputResponses) == 0 || !hmac.Equal([]byte(p.RequestState), []byte(a.approvalState(tok, approvalID))) {
		return nil, false
	}
	answer, ok := p.InputResponses[approvalInputKey].(*mcp.ElicitResult)
	return answer, ok
}

// callResult is what CallTool came to as an MCP tool result: the result as the pool
// sanitized it; a refusal or a failure as a tool error whose text says which gate refused it
// and why, or that the call reached the server and may have taken effect, with the same in
// _meta for a program to read.
func callResult(res *CallResult, err error) (*mcp.CallToolResult, error) {
	var ref *RefusedError
	var failed *FailedError
	switch {
	case errors.As(err, &ref):
		detail := map[string]any{"reason": ref.Reason, "gate": gateOf(ref.Reason), "call_id": ref.CallID, "attempt": ref.Attempt}
		if ref.Level != "" {
			detail["level"] = ref.Level
		}
		if ref.ApprovalID != "" {
			detail["approval_id"] = ref.ApprovalID
		}
		text := fmt.Sprintf("Ringfence refused this call before it reached the server: the %s gate (%s) says: %s. Nothing was dispatched.", gateOf(ref.Reason), refusalLabel(ref), ref.Problem())
		return toolError(text, mcp.Meta{"io.ringfence/refusal": detail}), nil
	case errors.As(err, &failed):
		text := fmt.Sprintf("The call reached the server and failed (%s): %s. It may have taken effect.", failed.Class, failed.Problem())
		detail := map[string]any{"class": failed.Class, "call_id": failed.CallID, "attempt": failed.Attempt, "may_have_taken_effect": true}
		var rpcErr *jsonrpc.Error
		if errors.As(failed, &rpcErr) {
			// The server answered with a protocol error: the client gets it as one, under
			// the server's code (its message made safe, its data dropped by the pool).
			fields := map[string]any{}
			_ = json.Unmarshal(rpcErr.Data, &fields)
			fields["io.ringfence/failure"] = detail
			data, _ := json.Marshal(fields)
			return nil, &jsonrpc.Error{Code: rpcErr.Code, Message: text, Data: data}
		}
		return toolError(text, mcp.Meta{"io.ringfence/failure": detail}), nil
	case err != nil:
		return nil, err
	}
	out, err := mcpResult(res)
	if err != nil {
		return nil, err
	}
	call := map[string]any{"call_id": res.CallID, "attempt": res.Attempt}
	if res.ApprovalID != "" {
		call["approval_id"] = res.ApprovalID
	}
	if res.DispatchedCallID != "" {
		// A retry that got an approved call's outcome names the call that reached the server.
		call["dispatched_call_id"], call["dispatched_attempt"] = res.DispatchedCallID, res.DispatchedAttempt
	}
	if res.ResultDigest != "" {
		// Of the result as sent here (its _meta aside): the client can check it, and keep it to
		// find the outcome record that holds the same.
		call["result_digest"], call["result_size"] = res.ResultDigest, res.ResultSize
	}
	out.Meta = mcp.Meta{"io.ringfence/call": call}
	return out, nil
}

func refusalLabel(ref *RefusedError) string {
	if ref.Level != "" {
		return ref.Reason + ", level " + ref.Level
	}
	return ref.Reason
}

func toolError(text string, meta mcp.Meta) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: text}}, Meta: meta}
}

// mcpResult is the pool's result (content and structured content as the pool checked and
// sanitized them) decoded as the SDK's, which writes each content kind as MCP defines it.
func mcpResult(res *CallResult) (*mcp.CallToolResult, error) {
	if out, ok := textResult(res); ok {
		return out, nil
	}
	wire := struct {
		Content           []map[string]any `json:"content"`
		StructuredContent map[string]any   `json:"structuredContent,omitempty"`
		IsError           bool             `json:"isError,omitempty"`
	}{res.Content, res.StructuredContent, res.IsError}
	if wire.Content == nil {
		wire.Content = []map[string]any{}
	}
	b, err := json.Marshal(wire)
	if err != nil {
		return nil, err
	}
	var out mcp.CallToolResult
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("the server's result cannot be written as MCP: %v", err)
	}
	return &out, nil
}

// textResult is the common result, text items only and no structured content, built without
// a JSON round trip; ok is false for any other.
func textResult(res *CallResult) (*mcp.CallToolResult, bool) {
	if res.StructuredContent != nil {
		return nil, false
	}
	out := &mcp.CallToolResult{IsError: res.IsError, Content: make([]mcp.Content, 0, len(res.Content))}
	for _, c := range res.Content {
		text, ok := c["text"].(string)
		if len(c) != 2 || c["type"] != "text" || !ok {
			return nil, false
		}
		out.Content = append(out.Content, &mcp.TextContent{Text: text})
	}
	return out, true
}

// gateOf names the gate (docs/runtime.md, "The gates, in order") a refusal reason comes from.
func gateOf(reason string) string {
	switch reason {
	case reasonAuditUnavailable:
		return "audit"
	case reasonUnknownRun, reasonRunNotRunning, reasonUnknownAgent:
		return "run"
	case reasonApprovalRequired, reasonApprovalPending, reasonDeniedByApprover, reasonApprovalExpired:
		return "approval"
	case reasonUnknownTool:
		return "binding"
	case reasonCapability:
		return "floor"
	case reasonCeiling, reasonUnknownServer, reasonRegistryUnavailable:
		return "ceiling"
	case reasonFilteredOut, reasonNotLoaded:
		return "agent surface"
	case reasonAgentFloor:
		return "agent floor"
	case reasonArgumentScope:
		return "argument scope"
	case reasonInvalidInput, reasonUnusableSchema, reasonDeclarationScreen:
		return "schema"
	case reasonDocumentUnavailable:
		return "documents"
	case reasonSchemaDrift:
		return "drift"
	case reasonInlineServers:
		return "inline servers"
	}
	return "session"
}
