package store

import (
	"bytes"
	"context"
	"encoding/json"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Approval is a call that asked a person first, kept with its run: what the agent called,
// what became of it, and, once approved and dispatched, its outcome until the caller's retry
// of the same call takes it.
type Approval struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	RunID  string `json:"run_id"`
	// Agent, Tool (the binding name), CallID and Arguments are the call as the agent made
	// it; Arguments are its canonical JSON, my-documents:// references unresolved.
	Agent      string          `json:"agent"`
	Tool       string          `json:"tool"`
	ServerRef  string          `json:"server_ref,omitempty"`
	ToolName   string          `json:"tool_name,omitempty"`
	CallID     string          `json:"call_id"`
	Arguments  json.RawMessage `json:"arguments"`
	ArgsDigest string          `json:"args_digest"`
	// State is pending, approved, refused, denied or expired.
	State       string    `json:"state"`
	RequestTime time.Time `json:"request_time"`
	ExpireTime  time.Time `json:"expire_time"`
	DecidedBy   string    `json:"decided_by,omitempty"`
	DecideTime  time.Time `json:"decide_time,omitzero"`
	// Note is a denial's reason, or what refused or expired the call.
	Note string `json:"note,omitempty"`
	// Reason is the refusal reason a retry of a denied or expired call is told once.
	Reason string `json:"reason,omitempty"`
	// Outcome is what the approved execution came to, kept for the caller's retry until
	// Delivered or its time passes; nil for the other states.
	Outcome *Outcome `json:"outcome,omitempty"`
	// Delivered says the decision was handed to the caller's retry (once).
	Delivered bool `json:"delivered,omitempty"`
}

// Outcome is an approved execution's outcome as the caller's retry gets it.
type Outcome struct {
	// Result is the pool's result as JSON, when the call was answered; FailureClass and
	// FailureMessage say how a call that reached the server failed.
	Result         json.RawMessage `json:"result,omitempty"`
	FailureClass   string          `json:"failure_class,omitempty"`
	FailureMessage string          `json:"failure_message,omitempty"`
	// PendingID is the audit record of the execution, which the retry's record names.
	PendingID string `json:"pending_id,omitempty"`
	// Attempt is the execution's attempt number.
	Attempt int32 `json:"attempt,omitempty"`
	// Until is when it is dropped if no retry took it.
	Until time.Time `json:"until"`
}

func approvalKey(tenant, run, id string) []byte { return []byte(tenant + "/" + run + "/" + id) }

// PutApproval stores an approval's new state, durably.
func (s *Store) PutApproval(ctx context.Context, a Approval) error {
	val, err := json.Marshal(a)
	if err != nil {
		return err
	}
	return s.db.Batch(func(tx *bolt.Tx) error {
		return tx.Bucket(approvalsBucket).Put(approvalKey(a.Tenant, a.RunID, a.ID), val)
	})
}

// DeleteApprovals removes approvals of a run (the oldest, when the run keeps too many).
func (s *Store) DeleteApprovals(ctx context.Context, tenant, run string, ids ...string) error {
	return s.db.Batch(func(tx *bolt.Tx) error {
		b := tx.Bucket(approvalsBucket)
		for _, id := range ids {
			if err := b.Delete(approvalKey(tenant, run, id)); err != nil {
				return err
			}
		}
		return nil
	})
}

// RunApprovals reads a run's approvals, in the order of their ids.
func (s *Store) RunApprovals(ctx context.Context, tenant, run string) ([]Approval, error) {
	var out []Approval
	prefix := []byte(tenant + "/" + run + "/")
	err := s.db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(approvalsBucket).Cursor()
		for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			var a Approval
			if err := json.Unmarshal(v, &a); err != nil {
				return err
			}
			out = append(out, a)
		}
		return nil
	})
	return out, err
}
