package publisher

import (
	"context"

	publisherinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/publisher/v1"
)

// InternalServer serves the publisher's internal API (ringfence.internal.publisher.v1) on a
// split binary's internal listener. It is a type apart from Service so that no public server
// can register it by accident.
type InternalServer struct {
	publisherinternalv1.UnsafePublisherInternalServiceServer
	*Service
}

var _ publisherinternalv1.PublisherInternalServiceServer = (*InternalServer)(nil)

// Internal is the service's internal API.
func (s *Service) Internal() *InternalServer { return &InternalServer{Service: s} }

// GetPublishedVersion implements PublisherInternalService: the pool loads runs with it, inline
// env values in clear, since the pool is what would run them.
func (s *InternalServer) GetPublishedVersion(ctx context.Context, req *publisherinternalv1.GetPublishedVersionRequest) (*publisherinternalv1.GetPublishedVersionResponse, error) {
	v, err := s.versionProto(ctx, req.GetGraphId(), req.GetVersion(), false)
	if err != nil {
		return nil, err
	}
	return &publisherinternalv1.GetPublishedVersionResponse{Version: v}, nil
}
