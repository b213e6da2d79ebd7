package audit

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// ErrInvalidRecord is wrapped by every validation failure, so a service can map it to
// InvalidArgument without parsing messages.
var ErrInvalidRecord = errors.New("audit: invalid record")

// Bounds on what one record may carry. The log is append-only and kept forever, so a
// hostile or buggy producer must not be able to store megabytes per event.
const (
	MaxIDLen       = 64
	MaxFieldLen    = 512
	MaxChangeBytes = 64 << 10
	MaxAdvisory    = 64
	// MaxLoadedTools bounds a tool_search record's loaded_tools (a search returns at most 50).
	MaxLoadedTools = 64
)

// Validate reports whether r is a well-formed record that a log may store: the kind
// matches the payload, a tool call states the at-least-once guarantee, the outcome class
// is consistent, and every field is within bounds. Seq must be zero: the log assigns it.
// Errors wrap ErrInvalidRecord and never quote the admin change (it may hold a secret
// the producer failed to mask).
func (r *Record) Validate() error {
	if err := checkID(r.ID); err != nil {
		return err
	}
	if r.Seq != 0 {
		return invalid("seq is assigned by the log and must be 0 on append")
	}
	if r.Time.IsZero() {
		return invalid("time is required")
	}
	if err := checkField("producer", r.Producer, true); err != nil {
		return err
	}
	if err := checkField("tenant", r.Tenant, false); err != nil {
		return err
	}
	switch r.Kind {
	case KindAdmin:
		if r.Admin == nil || r.ToolCall != nil {
			return invalid("kind admin needs admin and no tool_call")
		}
		return r.Admin.validate()
	case KindToolCall:
		if r.ToolCall == nil || r.Admin != nil {
			return invalid("kind tool_call needs tool_call and no admin")
		}
		if r.Tenant == "" {
			return invalid("tenant is required for a tool call")
		}
		return r.ToolCall.validate()
	default:
		return invalid(fmt.Sprintf("kind %.32q is not admin or tool_call", string(r.Kind)))
	}
}

func (a *AdminEvent) validate() error {
	if err := checkIdent("admin.action", a.Action, true); err != nil {
		return err
	}
	for _, f := range []struct {
		name, v  string
		required bool
	}{
		{"admin.actor_key_id", a.ActorKeyID, false},
		{"admin.actor_key_name", a.ActorKeyName, false},
		{"admin.actor_role", a.ActorRole, true},
		{"admin.resource_type", a.ResourceType, true},
		{"admin.resource_id", a.ResourceID, false},
	} {
		if err := checkField(f.name, f.v, f.required); err != nil {
			return err
		}
	}
	if len(a.Change) > MaxChangeBytes {
		return invalid(fmt.Sprintf("admin.change is %d bytes, limit %d", len(a.Change), MaxChangeBytes))
	}
	if len(a.Change) > 0 && !json.Valid(a.Change) {
		return invalid("admin.change is not valid JSON")
	}
	return nil
}

func (tc *ToolCallAttempt) validate() error {
	if tc.OperationSupport != OperationSupportAtLeastOnce || !tc.OperationResidualDuplicateRisk {
		return invalid("tool_call must state operation_support at_least_once and operation_residual_duplicate_risk true")
	}
	for _, f := range []struct {
		name, v  string
		required bool
	}{
		{"tool_call.run_id", tc.RunID, true},
		{"tool_call.call_id", tc.CallID, true},
		{"tool_call.graph_id", tc.GraphID, false},
		{"tool_call.agent_node", tc.AgentNode, false},
		{"tool_call.tool_node", tc.ToolNode, false},
		{"tool_call.server_ref", tc.ServerRef, false},
		{"tool_call.tool_name", tc.ToolName, false},
		{"tool_call.pinned_hash", tc.PinnedHash, false},
		{"tool_call.live_hash", tc.LiveHash, false},
		{"tool_call.args_digest", tc.ArgsDigest, false},
		{"tool_call.result_digest", tc.ResultDigest, false},
	} {
		if err := checkField(f.name, f.v, f.required); err != nil {
			return err
		}
	}
	if tc.Attempt < 1 {
		return invalid("tool_call.attempt starts at 1")
	}
	if tc.PendingID != "" {
		if tc.Outcome != OutcomeDispatched || tc.Result == ResultPending {
			return invalid("tool_call.pending_id names the pending record a dispatched outcome settles; only such an outcome has one")
		}
		if err := checkID(tc.PendingID); err != nil {
			return invalid("tool_call.pending_id: " + err.Error())
		}
	}
	if tc.GraphVersion < 0 || tc.ArgsSize < 0 || tc.ResultSize < 0 || tc.LatencyMicros < 0 {
		return invalid("tool_call graph_version, sizes and latency must not be negative")
	}
	switch tc.Outcome {
	case OutcomeRefusedBeforeDispatch:
		if err := checkIdent("tool_call.reason", tc.Reason, true); err != nil {
			return err
		}
		if tc.Result != "" || tc.FailureClass != "" {
			return invalid("a call refused before dispatch has no result or failure_class")
		}
	case OutcomeDispatched:
		if tc.Reason != "" {
			return invalid("a dispatched call has no refusal reason")
		}
		switch tc.Result {
		case ResultSucceeded, ResultPending:
			if tc.FailureClass != "" {
				return invalid("a succeeded or pending call has no failure_class")
			}
		case ResultFailed:
			if err := checkIdent("tool_call.failure_class", tc.FailureClass, true); err != nil {
				return err
			}
		default:
			return invalid(fmt.Sprintf("tool_call.result %.32q is not succeeded, failed or pending", tc.Result))
		}
	default:
		return invalid(fmt.Sprintf("tool_call.outcome %.32q is not refused_before_dispatch or dispatched", tc.Outcome))
	}
	if len(tc.Advisory) > MaxAdvisory {
		return invalid(fmt.Sprintf("tool_call.advisory has %d entries, limit %d", len(tc.Advisory), MaxAdvisory))
	}
	for _, a := range tc.Advisory {
		if err := checkField("tool_call.advisory", a, true); err != nil {
			return err
		}
	}
	if len(tc.LoadedTools) > MaxLoadedTools {
		return invalid(fmt.Sprintf("tool_call.loaded_tools has %d entries, limit %d", len(tc.LoadedTools), MaxLoadedTools))
	}
	for _, n := range tc.LoadedTools {
		if err := checkField("tool_call.loaded_tools", n, true); err != nil {
			return err
		}
	}
	if a := tc.Approval; a != nil {
		if err := checkField("tool_call.approval.id", a.ID, true); err != nil {
			return err
		}
		switch a.State {
		case ApprovalPending, ApprovalApproved, ApprovalDenied, ApprovalExpired, ApprovalDelivered:
		default:
			return invalid(fmt.Sprintf("tool_call.approval.state %.32q is not pending, approved, denied, expired or delivered", a.State))
		}
		if err := checkField("tool_call.approval.decided_by", a.DecidedBy, false); err != nil {
			return err
		}
		if err := checkField("tool_call.approval.note", a.Note, false); err != nil {
			return err
		}
		if err := checkField("tool_call.approval.dispatched_call_id", a.DispatchedCallID, false); err != nil {
			return err
		}
	}
	return nil
}

// MaxClockSkew bounds how far a record's time may be ahead of the audit log's clock when the
// log receives it. Records reach the log late (a spool holds them through an outage), never
// early: a time past this bound is a producer whose clock is wrong, or a record forged to
// sort after everything written until then.
const MaxClockSkew = 5 * time.Minute

// CheckReceived refuses a record whose time is more than MaxClockSkew after received, the
// audit log's clock when it took the record. The error wraps ErrInvalidRecord: no resend
// changes the record, so its producer quarantines it.
func (r *Record) CheckReceived(received time.Time) error {
	if ahead := r.Time.Sub(received); ahead > MaxClockSkew {
		return invalid(fmt.Sprintf("time %s is %s ahead of the audit log's clock (%s), more than the %s a producer's clock may run ahead: fix the producer host's clock (NTP); the producer quarantines the record, and audit.requeue_quarantine sends it again once its time has passed",
			r.Time.UTC().Format(time.RFC3339Nano), ahead.Round(time.Second), received.UTC().Format(time.RFC3339), MaxClockSkew))
	}
	return nil
}

func invalid(msg string) error { return fmt.Errorf("%w: %s", ErrInvalidRecord, msg) }

func checkID(id string) error {
	if id == "" || len(id) > MaxIDLen {
		return invalid(fmt.Sprintf("id must be 1 to %d characters", MaxIDLen))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_' || c == '.' || c == ':') {
			return invalid("id may hold only letters, digits and - _ . :")
		}
	}
	return nil
}

func checkField(name, v string, required bool) error {
	if problem := FieldProblem(v, required); problem != "" {
		return invalid(name + " " + problem)
	}
	return nil
}

// FieldProblem says what is wrong with a record's text field ("" for nothing): producers
// check request fields with it before they act, so an attempt never fails to be recorded
// because a field is one the log refuses.
func FieldProblem(v string, required bool) string {
	switch {
	case v == "" && required:
		return "is required"
	case len(v) > MaxFieldLen:
		return fmt.Sprintf("is %d bytes, limit %d", len(v), MaxFieldLen)
	case !utf8.ValidString(v):
		return "is not valid UTF-8"
	}
	return ""
}

// checkIdent admits the lower-case snake_case codes used for actions, reasons and
// failure classes, so readers can filter on them reliably.
func checkIdent(name, v string, required bool) error {
	if v == "" {
		if required {
			return invalid(name + " is required")
		}
		return nil
	}
	if len(v) > 64 {
		return invalid(fmt.Sprintf("%s is longer than 64 bytes", name))
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return invalid(fmt.Sprintf("%s %.64q must be lower-case letters, digits and _", name, v))
		}
	}
	return nil
}
