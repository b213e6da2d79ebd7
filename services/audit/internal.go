package audit

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	auditinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/audit/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/audit/auditpb"
	"github.com/ringfence/ringfence/internal/mtls"
)

// InternalServer serves the audit service's internal API (ringfence.internal.audit.v1) on a
// split binary's internal listener: the producers' appends. It is a type apart from Service so
// that no public server can register it by accident.
type InternalServer struct {
	auditinternalv1.UnsafeAuditInternalServiceServer
	svc *Service
}

var _ auditinternalv1.AuditInternalServiceServer = (*InternalServer)(nil)

// Internal is the service's internal API.
func (s *Service) Internal() *InternalServer { return &InternalServer{svc: s} }

// Append implements AuditInternalService.Append.
func (g *InternalServer) Append(ctx context.Context, req *auditinternalv1.AppendRequest) (*auditinternalv1.AppendResponse, error) {
	s := g.svc
	if len(req.GetRecords()) == 0 {
		return &auditinternalv1.AppendResponse{}, nil
	}
	if len(req.GetRecords()) > audit.MaxBatchSize {
		return nil, s.errors.Status(ctx, fieldErr("records", "at most %d per call", audit.MaxBatchSize))
	}
	// A record says which service produced it, and a certificate says which service is
	// calling: they must agree, and only the pool produces tool-call records. Otherwise a
	// compromised authoring host could write "succeeded" outcomes in the pool's name.
	peer, viaCert := mtls.PeerService(ctx)
	recs := make([]audit.Record, len(req.GetRecords()))
	for i, p := range req.GetRecords() {
		r, err := auditpb.RecordFromProto(p)
		if err != nil {
			return nil, s.errors.Status(ctx, err)
		}
		if viaCert && r.Producer != peer {
			return nil, s.errors.Status(ctx, fieldErr(fmt.Sprintf("records[%d].producer", i), "is %q, but the caller's certificate is the %s service's: a service appends only its own records", r.Producer, peer))
		}
		if viaCert && r.Kind == audit.KindToolCall && peer != mtls.Pool {
			return nil, s.errors.Status(ctx, fieldErr(fmt.Sprintf("records[%d].kind", i), "is tool_call, which only the pool produces"))
		}
		recs[i] = r
	}
	if s.shared != nil && !s.shared.Leading() {
		return nil, s.notLeader(ctx)
	}
	seqs, err := s.store.Append(ctx, recs)
	if errors.Is(err, ErrNotLeader) {
		return nil, s.notLeader(ctx)
	}
	if err != nil {
		return nil, s.errors.Status(ctx, err)
	}
	return &auditinternalv1.AppendResponse{Seqs: seqs}, nil
}

// notLeader is a standby's answer to Append.
func (s *Service) notLeader(ctx context.Context) error {
	leader, err := s.shared.Leader(ctx)
	msg := "audit: this instance is a standby: the leader appends"
	switch {
	case err != nil:
		msg += " (who leads could not be read: " + err.Error() + ")"
	case leader == "":
		msg += ", and none leads now (an election is under way): retry shortly"
	default:
		msg += "; the leader is " + leader
	}
	st, derr := status.New(codes.Unavailable, msg+"; list every audit instance in peers.audit_addr").WithDetails(&errdetails.ErrorInfo{
		Reason: audit.NotLeaderReason, Domain: "ringfence.audit.v1", Metadata: map[string]string{"leader": leader},
	})
	if derr != nil {
		return status.Error(codes.Unavailable, msg)
	}
	return st.Err()
}
