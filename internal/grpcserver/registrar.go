package grpcserver

import "google.golang.org/grpc"

// Registrar is where services register (Server.GRPC). Each service is served by two
// grpc.Servers with the same interceptors: one behind the gRPC listener, with its bounds
// (networkOptions), and one behind the REST gateway's in-process connection, without them.
type Registrar interface {
	grpc.ServiceRegistrar
	// GetServiceInfo lists the services, as reflection does.
	GetServiceInfo() map[string]grpc.ServiceInfo
}

type servers struct{ network, gateway *grpc.Server }

func (s servers) RegisterService(sd *grpc.ServiceDesc, impl any) {
	s.network.RegisterService(sd, impl)
	s.gateway.RegisterService(sd, impl)
}

func (s servers) GetServiceInfo() map[string]grpc.ServiceInfo { return s.network.GetServiceInfo() }
