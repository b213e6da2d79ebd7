package audit

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"time"
)

// Kind says which of the two record shapes a Record carries.
type Kind string

const (
	KindAdmin    Kind = "admin"
	KindToolCall Kind = "tool_call"
)

// Record is one entry of the audit trail. Exactly one of Admin and ToolCall is set,
// matching Kind. Seq is zero until the audit log assigns it; the log, not the producer,
// owns ordering.
type Record struct {
	ID       string           `json:"id"`
	Seq      uint64           `json:"seq,omitempty"`
	Time     time.Time        `json:"time"`
	Kind     Kind             `json:"kind"`
	Tenant   string           `json:"tenant,omitempty"`
	Producer string           `json:"producer"`
	Admin    *AdminEvent      `json:"admin,omitempty"`
	ToolCall *ToolCallAttempt `json:"tool_call,omitempty"`
	// ReceiveTime is when the audit log took the record, by the log's own clock, beside the
	// producer's Time. The log sets it (a producer's value is discarded) and stores it inside
	// the hashed body, after the chain fields; records stored before it existed have none.
	ReceiveTime time.Time `json:"receive_time,omitzero"`
}

// Admin actions recorded by the control plane. The set is open: a producer may record
// another lower-case identifier, but these names are the ones readers filter on.
const (
	ActionCreate    = "create"
	ActionUpdate    = "update"
	ActionDelete    = "delete"
	ActionImport    = "import"
	ActionPublish   = "publish"
	ActionKeyCreate = "key_create"
	ActionKeyRevoke = "key_revoke"
	// ActionExplore records that an operator started an ad-hoc, unregistered server.
	ActionExplore = "explore"
	// ActionAuditRecordsDropped is written by a spool that was told to continue when
	// full; the record says how many records were dropped, so the gap is itself audited.
	ActionAuditRecordsDropped = "audit_records_dropped"
)

// ActorRoleSystem marks events no API key caused (the spool's own drop report).
const ActorRoleSystem = "system"

// AdminEvent is a change to control-plane state. Change is the change itself as JSON,
// with every secret already replaced by SecretMask by the producer: the audit log stores
// what it is given and cannot tell a secret from a value.
type AdminEvent struct {
	ActorKeyID string `json:"actor_key_id"`
	// ActorKeyName is the key's name, so a record says what the key is ("ci", "ops")
	// beside its id. Records written before it have none.
	ActorKeyName string          `json:"actor_key_name,omitempty"`
	ActorRole    string          `json:"actor_role"`
	Action       string          `json:"action"`
	ResourceType string          `json:"resource_type"`
	ResourceID   string          `json:"resource_id"`
	Change       json.RawMessage `json:"change,omitempty"`
}

// The guarantee an mcp_tool call carries, stated on every tool-call record.
const (
	OperationSupportAtLeastOnce = "at_least_once"
)

// Outcome classes of a tool-call attempt. Only a refusal before dispatch means nothing
// happened; a dispatched call that failed may still have taken effect.
const (
	OutcomeRefusedBeforeDispatch = "refused_before_dispatch"
	OutcomeDispatched            = "dispatched"
)

// Results of a dispatched call.
const (
	ResultSucceeded = "succeeded"
	ResultFailed    = "failed"
	// ResultPending marks the record a producer writes, durably, just before a call goes to
	// the server: the outcome follows in a record with the same call_id and attempt. A
	// pending record with no outcome after it is a call whose producer stopped (a crash)
	// before it knew what happened: it reached the server and may have taken effect.
	ResultPending = "pending"
)

// Reasons for a refusal before dispatch.
const (
	ReasonUnknownServer     = "unknown_server"
	ReasonUnknownTool       = "unknown_tool"
	ReasonCapability        = "capability"
	ReasonCeiling           = "ceiling"
	ReasonAgentFloor        = "agent_floor"
	ReasonArgumentScope     = "argument_scope"
	ReasonInvalidInput      = "invalid_input"
	ReasonIsolationRequired = "isolation_required"
	ReasonSpawnFailed       = "spawn_failed"
	ReasonHandshakeFailed   = "handshake_failed"
	ReasonSchemaDrift       = "schema_drift"
	ReasonApprovalRequired  = "approval_required"
	// ReasonUnusableSchema: the tool's input or output schema cannot be compiled, so
	// neither the arguments nor the result could be checked; the declaration must be fixed
	// (and a pinned one re-imported), not the caller's arguments.
	ReasonUnusableSchema = "unusable_schema"
	// ReasonDeclarationScreen: the declaration screen hard-fails the tool's live declaration
	// (a tool that was never pinned: explore, the inline path).
	ReasonDeclarationScreen = "declaration_screen"
)

// Failure classes of a dispatched call that failed.
const (
	FailureToolError      = "tool_error"
	FailureTimeout        = "timeout"
	FailureTransportError = "transport_error"
	FailureCrashed        = "crashed"
	FailureOutputInvalid  = "output_invalid"
)

// ToolCallAttempt is one attempt to call an MCP tool, whether or not it reached the
// server. Arguments and results are recorded only as digests and sizes: the audit trail
// must not become a second copy of tool payloads.
type ToolCallAttempt struct {
	RunID        string `json:"run_id"`
	GraphID      string `json:"graph_id,omitempty"`
	GraphVersion int64  `json:"graph_version,omitempty"`
	AgentNode    string `json:"agent_node,omitempty"`
	ToolNode     string `json:"tool_node,omitempty"`
	ServerRef    string `json:"server_ref,omitempty"`
	ToolName     string `json:"tool_name,omitempty"`
	CallID       string `json:"call_id"`
	Attempt      int32  `json:"attempt"`
	// PendingID, on the outcome of a dispatched call, is the ID of the pending record it
	// settles: a pending record no outcome names is a call its producer stopped during. The
	// ID pairs them exactly, where call_id and attempt repeat across producer restarts.
	PendingID string `json:"pending_id,omitempty"`

	OperationSupport               string `json:"operation_support"`
	OperationResidualDuplicateRisk bool   `json:"operation_residual_duplicate_risk"`

	Outcome      string `json:"outcome"`
	Reason       string `json:"reason,omitempty"`
	Result       string `json:"result,omitempty"`
	FailureClass string `json:"failure_class,omitempty"`

	PinnedHash string `json:"pinned_hash,omitempty"`
	LiveHash   string `json:"live_hash,omitempty"`

	ArgsDigest    string `json:"args_digest,omitempty"`
	ArgsSize      int64  `json:"args_size,omitempty"`
	ResultDigest  string `json:"result_digest,omitempty"`
	ResultSize    int64  `json:"result_size,omitempty"`
	LatencyMicros int64  `json:"latency_micros,omitempty"`

	// Advisory lists the rules that would have refused the call but were only recorded
	// because the run is in advisory mode.
	Advisory []string `json:"advisory,omitempty"`

	// WarmSession says the session that served the call came from the pool's warm set: a
	// container started before the run, as a cold start would have made it, for this run only.
	WarmSession bool `json:"warm_session,omitempty"`
	// Approval is set on the records of a call that asked a person first: its approval as
	// this record saw it.
	Approval *ToolCallApproval `json:"approval,omitempty"`
	// LoadedTools are the deferred tools a tool_search call loaded for the agent (binding
	// names; at most MaxLoadedTools).
	LoadedTools []string `json:"loaded_tools,omitempty"`
	// AgentTokenID names the MCP front door's agent token the call came through (the token
	// itself is never recorded); empty for a call through the API.
	AgentTokenID string `json:"agent_token_id,omitempty"`
}

// ToolCallApproval is the approval of a call that asked for confirmation, as one record of
// the call saw it.
type ToolCallApproval struct {
	ID string `json:"id"`
	// State is one of the Approval… states.
	State string `json:"state"`
	// DecidedBy names the approver as every admin record names an actor; empty for an expiry.
	DecidedBy  string    `json:"decided_by,omitempty"`
	DecideTime time.Time `json:"decide_time,omitzero"`
	// Note is a denial's reason, as the approver wrote it (bounded).
	Note string `json:"note,omitempty"`
	// DispatchedCallID and DispatchedAttempt, on a delivered record, name the approved
	// execution whose outcome the retry got (its records' call_id and attempt): the retry is a
	// call of its own.
	DispatchedCallID  string `json:"dispatched_call_id,omitempty"`
	DispatchedAttempt int32  `json:"dispatched_attempt,omitempty"`
}

// States of a call's approval in its records.
const (
	// ApprovalPending: the call waits for an approver (refused as approval_required).
	ApprovalPending = "pending"
	// ApprovalApproved: an approver approved it; the records of its execution (or the refusal
	// of a gate that ran again at approval) carry it.
	ApprovalApproved = "approved"
	// ApprovalDenied: an approver denied it (refused as denied_by_approver).
	ApprovalDenied = "denied"
	// ApprovalExpired: nobody decided in time, or the run ended first.
	ApprovalExpired = "expired"
	// ApprovalDelivered: the outcome of the approved execution was handed to the caller's
	// retry of the same call; the server was not reached again.
	ApprovalDelivered = "delivered"
)

// NewID returns a fresh record ID: 128 bits, hex encoded, of which the first 48 are the
// Unix time in milliseconds and the other 80 are random. Producers mint the ID once,
// before the record is spooled, so every resend carries the same ID and the log can
// suppress the duplicate.
//
// The time prefix is for the log, not for readers: IDs minted close together sort close
// together, so the log's ID index grows at its end instead of rewriting a random page
// of a large B+tree for every record (the difference is measured in the store's
// BenchmarkAppendDurable). 80 random bits per millisecond keep IDs unguessable and
// collisions out of reach. Nothing may rely on the prefix being a trustworthy time.
func NewID() string {
	var b [16]byte
	ms := uint64(time.Now().UnixMilli())
	for i := range 6 {
		b[i] = byte(ms >> (40 - 8*i))
	}
	// crypto/rand.Read never returns an error and never short-reads (Go 1.24+).
	_, _ = rand.Read(b[6:])
	return hex.EncodeToString(b[:])
}

// NewAdminRecord builds an admin-event record with a fresh ID and the current time.
// ev.Change must already be masked.
func NewAdminRecord(producer, tenant string, ev AdminEvent) Record {
	return Record{
		ID:       NewID(),
		Time:     time.Now().UTC(),
		Kind:     KindAdmin,
		Tenant:   tenant,
		Producer: producer,
		Admin:    &ev,
	}
}

// NewToolCallRecord builds a tool-call record with a fresh ID and the current time. It
// always states the at-least-once guarantee and the residual duplicate risk, whatever
// the caller put in those fields: the gap is marked on every record, never implied.
func NewToolCallRecord(producer, tenant string, tc ToolCallAttempt) Record {
	tc.OperationSupport = OperationSupportAtLeastOnce
	tc.OperationResidualDuplicateRisk = true
	return Record{
		ID:       NewID(),
		Time:     time.Now().UTC(),
		Kind:     KindToolCall,
		Tenant:   tenant,
		Producer: producer,
		ToolCall: &tc,
	}
}

// Refused marks the attempt as refused before dispatch for reason (one of the Reason
// constants): the tool was never reached and nothing happened.
func (tc *ToolCallAttempt) Refused(reason string) {
	tc.Outcome = OutcomeRefusedBeforeDispatch
	tc.Reason = reason
	tc.Result = ""
	tc.FailureClass = ""
}

// Pending marks the attempt as about to be dispatched, its outcome to follow.
func (tc *ToolCallAttempt) Pending() {
	tc.Outcome = OutcomeDispatched
	tc.Reason = ""
	tc.Result = ResultPending
	tc.FailureClass = ""
}

// Succeeded marks the attempt as dispatched and successful.
func (tc *ToolCallAttempt) Succeeded() {
	tc.Outcome = OutcomeDispatched
	tc.Reason = ""
	tc.Result = ResultSucceeded
	tc.FailureClass = ""
}

// Failed marks the attempt as dispatched and failed with class (one of the Failure
// constants): the call reached the server and may have taken effect.
func (tc *ToolCallAttempt) Failed(class string) {
	tc.Outcome = OutcomeDispatched
	tc.Reason = ""
	tc.Result = ResultFailed
	tc.FailureClass = class
}
