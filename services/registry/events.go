package registry

import (
	"context"
	"encoding/json"
	"maps"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/registry/internal/store"
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
func (s *Service) event(ctx context.Context, action, resourceType, resourceID string, change any) store.Hook {
	return s.tenantEvent(ctx, "", action, resourceType, resourceID, change)
}

// tenantEvent is event for a change to a thing of tenant (an API key bound to it): its record
// is in that tenant, where the tenant's auditors read it. Registrations and secrets are
// deployment-wide, and their records are in no tenant.
func (s *Service) tenantEvent(ctx context.Context, tenant, action, resourceType, resourceID string, change any) store.Hook {
	rec, err := s.record(ctx, tenant, action, resourceType, resourceID, change)
	return func(r audit.Recorder) error {
		if err != nil {
			return err
		}
		return r.Record(rec)
	}
}

// record is the admin record, in tenant, of an action by ctx's caller. change must already be
// masked.
func (s *Service) record(ctx context.Context, tenant, action, resourceType, resourceID string, change any) (audit.Record, error) {
	p, _ := auth.FromContext(ctx)
	actorID, actorName, role := p.AuditActor()
	raw, err := marshalChange(change)
	if err != nil {
		return audit.Record{}, err
	}
	// A registration within the limits can still be far larger than a record may hold (64
	// args of 4 KiB, before and after): the record keeps what fits and summarizes the rest.
	if raw, err = audit.BoundChange(raw); err != nil {
		return audit.Record{}, unrecordable(err)
	}
	rec := audit.NewAdminRecord("registry", tenant, audit.AdminEvent{
		ActorKeyID: actorID, ActorKeyName: actorName, ActorRole: role, Action: action,
		ResourceType: resourceType, ResourceID: resourceID, Change: raw,
	})
	// Checked here, before the change is written, so a record the log would refuse fails
	// the request with a reason rather than as an internal error from the spool.
	if err := rec.Validate(); err != nil {
		return audit.Record{}, unrecordable(err)
	}
	return rec, nil
}

// updateChange is the change an update records: the registration before and after as
// responses show them (env values and the URL's query values masked), and whether the URL
// or any env value changed, which the masks alone cannot say.
func updateChange(before, after *mcpserver.Registration) map[string]any {
	return map[string]any{
		"before":      serverToProto(before),
		"after":       serverToProto(after),
		"url_changed": before.URL != after.URL,
		"env_changed": !maps.Equal(before.Env, after.Env),
	}
}

// marshalChange renders a change as JSON: proto messages as the API shows them (env values
// already masked by serverToProto), anything else with encoding/json.
func marshalChange(change any) (json.RawMessage, error) {
	switch c := change.(type) {
	case nil:
		return nil, nil
	case proto.Message:
		return protojson.MarshalOptions{UseProtoNames: true}.Marshal(c)
	case map[string]any:
		out := make(map[string]json.RawMessage, len(c))
		for k, v := range c {
			b, err := marshalChange(v)
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
