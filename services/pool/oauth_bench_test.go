package pool

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/testutil/oauthtest"
)

// BenchmarkSignInCall: a warm call to a tool of a server that signs each user in (the real
// authorization server and streamable HTTP MCP server of oauth_test.go, on loopback), with the
// pool's store on bbolt and on etcd (one member on loopback), in one run. Besides the call, the
// pool reads per call the user's listing of the server (the agent's surface) and checks that
// the user's stored token is still the one the session carries. The bbolt figure is the floor:
// `etcd-over-bbolt` is what a pool host on etcd pays for those reads.
//
//	go test -run '^$' -bench 'SignInCall$' -benchtime 2000x ./services/pool/
func BenchmarkSignInCall(b *testing.B) {
	var floor float64
	for _, backend := range []string{"bbolt", "etcd"} {
		b.Run("store="+backend, func(b *testing.B) {
			var w *oauthWorld
			var p *Service
			if backend == "bbolt" {
				w = oauthHarness(b)
				p = w.pool
			} else {
				var open func(string) *Service
				w, open = oauthHosts(b)
				p = open("h1")
				b.Cleanup(func() { require.NoError(b, p.Close(context.Background())) })
			}
			c, err := p.ConnectServer(w.ctx, auth.DefaultTenant, oauthtest.Alice, "tickets")
			require.NoError(b, err)
			_, err = p.CompleteSignIn(w.ctx, callbackQuery(b, w.as.SignIn(b, c.AuthorizationURL, oauthtest.Alice)))
			require.NoError(b, err)
			run := w.startOn(p, oauthtest.Alice)
			for range 20 { // the session, its listing and the connections warm
				_, err := w.whoamiOn(p, run)
				require.NoError(b, err)
			}

			lat := make(latencies, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				if _, err := w.whoamiOn(p, run); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			lat.report(b, "")
			p50 := float64(lat.quantile(50).Microseconds())
			if backend == "bbolt" {
				floor = p50
			} else if floor > 0 {
				b.ReportMetric(p50/floor, "etcd-over-bbolt")
			}
		})
	}
}
