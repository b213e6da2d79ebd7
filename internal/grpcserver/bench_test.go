package grpcserver

import (
	"context"
	"io"
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	"google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/ringfence/ringfence/internal/auth"
)

const benchKey = "rf_benchmark-key-of-realistic-length-0123456789"

// keyTable verifies keys from a map, as the registry does from its in-memory key table.
type keyTable map[string]auth.Principal

func (k keyTable) VerifyKey(_ context.Context, h string) (auth.Principal, error) {
	p, ok := k[h]
	if !ok {
		return auth.Principal{}, auth.ErrUnknownKey
	}
	return p, nil
}

// BenchmarkUnaryHop measures the floor one gRPC hop on loopback puts under every call through
// a Ringfence service: a health Check on this package's server (interceptors, access log,
// metrics, stream workers) beside the same Check on a bare grpc-go server, each back to back
// and after the caller was idle for 500 µs, as a call is in the pool's warm-call loop. On a
// virtual machine the idle case is mostly the time it takes to wake a halted vCPU.
func BenchmarkUnaryHop(b *testing.B) {
	servers := []struct {
		name string
		dial func(b *testing.B) *grpc.ClientConn
	}{
		{"ringfence", func(b *testing.B) *grpc.ClientConn {
			srv := New(Options{Name: "bench", GRPCAddr: "127.0.0.1:0", Authorizer: allowAll{}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			conn, _ := start(b, srv)
			return conn
		}},
		{"ringfence-api-key", func(b *testing.B) *grpc.ClientConn {
			// The Check needs a permission here, so every call carries an API key that the
			// server verifies (a hash and an in-memory lookup, as the registry does in-process).
			rules := map[string]auth.Rule{grpc_health_v1.Health_Check_FullMethodName: {Permission: auth.AuditRead}}
			keys := keyTable{auth.HashKey(benchKey): {KeyID: "key_bench", Role: auth.RoleAuditor, Permissions: []auth.Permission{auth.AuditRead}}}
			srv := New(Options{Name: "bench", GRPCAddr: "127.0.0.1:0", Authorizer: auth.NewAuthorizer(keys, rules), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			_, _ = start(b, srv)
			g, _, err := srv.Addrs(b.Context())
			require.NoError(b, err)
			conn, err := grpc.NewClient(g.String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
					return invoker(metadata.AppendToOutgoingContext(ctx, auth.MetadataKey, benchKey), method, req, reply, cc, opts...)
				}))
			require.NoError(b, err)
			b.Cleanup(func() { conn.Close() })
			return conn
		}},
		{"bare-grpc-go", func(b *testing.B) *grpc.ClientConn {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(b, err)
			srv := grpc.NewServer()
			grpc_health_v1.RegisterHealthServer(srv, health.NewServer())
			go srv.Serve(lis)
			b.Cleanup(srv.Stop)
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			require.NoError(b, err)
			b.Cleanup(func() { conn.Close() })
			return conn
		}},
	}
	for _, s := range servers {
		for _, idle := range []time.Duration{0, 500 * time.Microsecond} {
			name := s.name + "/back-to-back"
			if idle > 0 {
				name = s.name + "/after-idle-500us"
			}
			b.Run(name, func(b *testing.B) {
				client := grpc_health_v1.NewHealthClient(s.dial(b))
				ctx := context.Background()
				for range 100 { // connect and warm up
					_, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{})
					require.NoError(b, err)
				}
				took := make([]time.Duration, 0, b.N)
				b.ResetTimer()
				for range b.N {
					if idle > 0 {
						time.Sleep(idle)
					}
					t0 := time.Now()
					if _, err := client.Check(ctx, &grpc_health_v1.HealthCheckRequest{}); err != nil {
						b.Fatal(err)
					}
					took = append(took, time.Since(t0))
				}
				b.StopTimer()
				slices.Sort(took)
				b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
				b.ReportMetric(float64(took[min(len(took)-1, len(took)*99/100)].Microseconds()), "p99-µs")
			})
		}
	}
}
