package registry

import (
	"context"
	"encoding/json"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
)

// Resource types in the registry's admin events.
const (
	resourceServer = "mcp_server"
	resourceSecret = "secret"
	resourceKey    = "api_key"
)

// event returns a store hook that writes the admin event for a change into the audit outbox
// in the change's own transaction: no change without its record, no record without its
// change. change must already be masked.
func (s *Service) event(ctx context.Context, action, resourceType, resourceID string, change any) func(tx *bolt.Tx) error {
	rec, err := s.record(ctx, action, resourceType, resourceID, change)
	return func(tx *bolt.Tx) error {
		if err != nil {
			return err
		}
		return s.spool.EnqueueTx(tx, rec)
	}
}

// record is the admin record of an action by ctx's caller. change must already be masked.
func (s *Service) record(ctx context.Context, action, resourceType, resourceID string, change any) (audit.Record, error) {
	p, _ := auth.FromContext(ctx)
	actorID, role := p.AuditActor()
	raw, err := marshalChange(change)
	if err != nil {
		return audit.Record{}, err
	}
	// A registration within the limits can still be far larger than a record may hold (64
	// args of 4 KiB, before and after): the record keeps what fits and summarizes the rest.
	if raw, err = audit.BoundChange(raw); err != nil {
		return audit.Record{}, unrecordable(err)
	}
	rec := audit.NewAdminRecord("registry", "", audit.AdminEvent{
		ActorKeyID: actorID, ActorRole: role, Action: action,
		ResourceType: resourceType, ResourceID: resourceID, Change: raw,
	})
	// Checked here, before the change is written, so a record the log would refuse fails
	// the request with a reason rather than as an internal error from the spool.
	if err := rec.Validate(); err != nil {
		return audit.Record{}, unrecordable(err)
	}
	return rec, nil
}

// marshalChange renders a change as JSON: proto messages as the API shows them (env values
// already masked by serverToProto), anything else with encoding/json.
func marshalChange(change any) (json.RawMessage, error) {
	switch c := change.(type) {
	case nil:
		return nil, nil
	case proto.Message:
		return protojson.MarshalOptions{UseProtoNames: true}.Marshal(c)
	case map[string]proto.Message:
		out := make(map[string]json.RawMessage, len(c))
		for k, m := range c {
			b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
			if err != nil {
				return nil, err
			}
			out[k] = b
		}
		return json.Marshal(out)
	default:
		return json.Marshal(c)
	}
}
