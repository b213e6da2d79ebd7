package grpcserver

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protowire"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/mtls"
)

const (
	floodAdminKey = "rf_flood-test-admin-key-0123456789abcdef"
	createServer  = "/ringfence.registry.v1.RegistryService/CreateServer"
	resolveServer = registryinternalv1.RegistryInternalService_ResolveServer_FullMethodName
	// quiet is how long a test waits for a server that should answer and does not (the
	// failure case); answers that come end the wait at once.
	quiet = 5 * time.Second
)

// floodServer serves the registry's RPCs (answered by listOnly) behind the real authorizer and
// rules, with one admin key, and returns its gRPC and HTTP addresses and its log (one refusal
// line per peer and reason: sweeps are TestRefusalsAreLoggedOncePerPeerAndInterval's).
func floodServer(t *testing.T, opts Options) (*Server, string, string, *lockedBuffer) {
	t.Helper()
	logs := &lockedBuffer{}
	keys := keyTable{auth.HashKey(floodAdminKey): {KeyID: "key_admin", Role: auth.RoleAdmin, Permissions: auth.AllPermissions}}
	opts.Name, opts.GRPCAddr, opts.HTTPAddr = "t", "127.0.0.1:0", "127.0.0.1:0"
	opts.Authorizer = auth.NewAuthorizer(keys, auth.Rules)
	opts.Logger = slog.New(slog.NewTextHandler(logs, nil))
	srv := New(opts)
	srv.refusals.every = time.Hour // the first line of each peer is its only one
	registryv1.RegisterRegistryServiceServer(srv.GRPC(), listOnly{})
	// An internal service on the same server, so its methods are served and decided by the
	// peer certificate (a real binary serves them on its internal listener only).
	registryinternalv1.RegisterRegistryInternalServiceServer(srv.GRPC(), registryinternalv1.UnimplementedRegistryInternalServiceServer{})
	start(t, srv)
	g, h, err := srv.Addrs(t.Context())
	require.NoError(t, err)
	return srv, g.String(), h.String(), logs
}

func streamIDs(n int) []uint32 {
	ids := make([]uint32, n)
	for i := range ids {
		ids[i] = uint32(2*i + 1)
	}
	return ids
}

// message is a protobuf message of exactly n bytes: field num holding a string of the rest.
func message(num protowire.Number, n int) []byte {
	b := protowire.AppendTag(nil, num, protowire.BytesType)
	for v := 1; ; v++ {
		if l := n - len(b) - v; protowire.SizeVarint(uint64(l)) == v {
			b = protowire.AppendVarint(b, uint64(l))
			return append(b, strings.Repeat("m", l)...)
		}
	}
}

// heapInUse is the live heap after a full collection.
func heapInUse() uint64 {
	goruntime.GC()
	goruntime.GC()
	var m goruntime.MemStats
	goruntime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestStrangersStreamsAreRefusedBeforeTheirBodiesAreRead is the no-key flood of issue 19: one
// connection holds 200 streams, each announcing a 4 MiB CreateServerRequest and sending its
// body slowly, as far as the server's flow-control windows let it. Every stream is refused
// UNAUTHENTICATED before the server asks for its body (it never opens the stream's window),
// the server's live heap stays within 16 MiB of where it was (the bodies announced come to
// 800 MiB; before the tap, grpc-go read every one into memory for the interceptor), and the
// flood is one WARN line naming the peer, not one per stream.
func TestStrangersStreamsAreRefusedBeforeTheirBodiesAreRead(t *testing.T) {
	const (
		streams   = 200
		announce  = 4 << 20
		heapBound = 16 << 20
	)
	srv, addr, _, logs := floodServer(t, Options{})

	before := heapInUse()
	h := dialH2(t, addr, nil)
	ids := streamIDs(streams)
	for _, id := range ids {
		h.open(id, createServer, nil, announce)
	}
	res, last := h.pump(ids, make([]byte, 1<<20), false, quiet)
	grown := int64(heapInUse()) - int64(before)

	for _, id := range ids {
		r := res[id]
		require.False(t, r.asked, "stream %d: the server asked for the body of a caller without a key", id)
		require.NotNil(t, r.answer, "stream %d: no refusal after %d body bytes (last event %+v)", id, r.sent, last)
		require.Equal(t, int(codes.Unauthenticated), r.answer.grpcStatus(), "stream %d: %v", id, r.answer.fields)
		require.Contains(t, r.answer.fields["grpc-message"], "missing API key")
	}
	require.Less(t, grown, int64(heapBound), "refusing %d streams grew the live heap by %d bytes", streams, grown)

	local := h.conn.LocalAddr().(*net.TCPAddr).IP.String()
	require.Equal(t, 1, strings.Count(logs.String(), "level=WARN"), logs.String())
	require.Contains(t, logs.String(), `level=WARN msg="refused a peer before reading a request" listener=grpc peer=`+local+" reason=Unauthenticated refused=1")
	require.NotContains(t, logs.String(), "msg=rpc", "refused streams never reach the interceptor")
	require.Equal(t, float64(streams), promtest.ToFloat64(srv.refusals.counter.WithLabelValues("grpc", "Unauthenticated")))
}

// TestAKeyHoldersStreamsAreRead is the same flood with a valid key, on fewer streams: each is
// admitted, its body asked for and read whole (4 MiB, the most a request may be), and the
// handler answers.
func TestAKeyHoldersStreamsAreRead(t *testing.T) {
	_, addr, _, _ := floodServer(t, Options{})
	h := dialH2(t, addr, nil)
	const announce = 4 << 20
	body := message(2, announce) // CreateServerRequest.description

	ids := streamIDs(8)
	for _, id := range ids {
		h.open(id, createServer, map[string]string{auth.MetadataKey: floodAdminKey}, announce)
	}
	res, last := h.pump(ids, body, true, quiet)
	for _, id := range ids {
		r := res[id]
		require.True(t, r.asked, "stream %d: the server did not ask for the body", id)
		require.NotNil(t, r.answer, "stream %d: no answer after %d body bytes (last event %+v)", id, r.sent, last)
		require.Equal(t, len(body), r.sent)
		require.Equal(t, int(codes.Unimplemented), r.answer.grpcStatus(), "stream %d reached the handler (listOnly): %v", id, r.answer.fields)
	}
}

// TestUnknownKeysAndUnruledMethodsAreRefusedUnread: a key the server does not know is refused
// as no key is, and a method the listener does not serve is refused UNIMPLEMENTED, both before
// the body is asked for. (A served method without a rule is auth.Admit's: TestAdmit.)
func TestUnknownKeysAndUnruledMethodsAreRefusedUnread(t *testing.T) {
	_, addr, _, _ := floodServer(t, Options{})
	h := dialH2(t, addr, nil)
	h.open(1, createServer, map[string]string{auth.MetadataKey: "rf_not-a-key-this-server-knows"}, 4<<20)
	h.open(3, "/ringfence.registry.v1.RegistryService/NoSuchMethod", map[string]string{auth.MetadataKey: floodAdminKey}, 4<<20)
	res, _ := h.pump([]uint32{1, 3}, make([]byte, 64<<10), false, quiet)
	require.False(t, res[1].asked)
	require.NotNil(t, res[1].answer)
	require.Equal(t, int(codes.Unauthenticated), res[1].answer.grpcStatus())
	require.Contains(t, res[1].answer.fields["grpc-message"], "unknown or revoked API key")
	require.False(t, res[3].asked)
	require.NotNil(t, res[3].answer)
	require.Equal(t, int(codes.Unimplemented), res[3].answer.grpcStatus())
	require.Contains(t, res[3].answer.fields["grpc-message"], "unknown method")
}

// TestInternalMethodsAreDecidedByThePeerCertificateBeforeReading: over TLS, the tap sees the
// connection's verified certificate. ResolveServer (the pool's alone) is admitted for the
// pool's certificate, and refused unread for another service's certificate and for none.
func TestInternalMethodsAreDecidedByThePeerCertificateBeforeReading(t *testing.T) {
	dir := t.TempDir()
	_, err := mtls.InitDevCA(dir, mtls.DevCAOptions{})
	require.NoError(t, err)
	files := func(svc string) mtls.Files {
		return mtls.Files{CertFile: filepath.Join(dir, svc+".pem"), KeyFile: filepath.Join(dir, svc+"-key.pem"), CAFile: filepath.Join(dir, "ca.pem")}
	}
	serverTLS, err := mtls.ServerConfig(files(mtls.Registry))
	require.NoError(t, err)
	_, addr, _, _ := floodServer(t, Options{TLS: serverTLS})
	noCert, err := mtls.CAOnlyConfig(filepath.Join(dir, "ca.pem"), "127.0.0.1", mtls.Registry)
	require.NoError(t, err)

	for _, tc := range []struct {
		name string
		cert string
		code codes.Code
	}{
		{"pool", mtls.Pool, codes.Unimplemented}, // admitted and read; the handler is unimplemented
		{"audit", mtls.Audit, codes.PermissionDenied},
		{"none", "", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := noCert
			if tc.cert != "" {
				cfg, err = mtls.ClientConfig(files(tc.cert), mtls.Registry)
				require.NoError(t, err)
			}
			h := dialH2(t, addr, cfg)
			body := message(1, 1<<20) // ResolveServerRequest.ref, larger than a stream's first window
			h.open(1, resolveServer, nil, uint32(len(body)))
			res, last := h.pump([]uint32{1}, body, true, quiet)
			require.NotNil(t, res[1].answer, "no answer (last event %+v)", last)
			require.Equal(t, int(tc.code), res[1].answer.grpcStatus(), "%v", res[1].answer.fields)
			if tc.code == codes.PermissionDenied {
				require.Contains(t, res[1].answer.fields["grpc-message"], "is internal")
				require.False(t, res[1].asked, "the server asked for the body of a refused caller")
			} else {
				require.True(t, res[1].asked)
				require.Equal(t, len(body), res[1].sent)
			}
		})
	}
}

// TestStreamsPerConnectionAreBounded: a key holder's connection holds at most 100 streams at
// once (announced in SETTINGS); the 101st is reset REFUSED_STREAM and the others go on.
func TestStreamsPerConnectionAreBounded(t *testing.T) {
	_, addr, _, _ := floodServer(t, Options{})
	h := dialH2(t, addr, nil)
	key := map[string]string{auth.MetadataKey: floodAdminKey}
	ids := streamIDs(DefaultMaxStreamsPerConn + 1)
	for _, id := range ids {
		h.open(id, createServer, key, 10) // a body that never comes: the handler waits for it
	}
	var announced uint32
	var refused []uint32
	for {
		ev, ok := h.next(quiet)
		require.True(t, ok, "no REFUSED_STREAM for the stream over the limit")
		require.NoError(t, ev.err)
		h.answer(ev)
		if v, ok := ev.settings[http2.SettingMaxConcurrentStreams]; ok {
			announced = v
		}
		if ev.typ == http2.FrameRSTStream || ev.endStream {
			require.Equal(t, http2.ErrCodeRefusedStream, ev.code, "%+v", ev)
			refused = append(refused, ev.stream)
			break
		}
	}
	require.Equal(t, uint32(DefaultMaxStreamsPerConn), announced)
	require.Equal(t, []uint32{ids[len(ids)-1]}, refused)
}

// TestConnectionsPerAddressAreBounded: past MaxConnsPerAddress open connections from one
// address, a new one is closed as soon as it is accepted, on the gRPC and the HTTP listener;
// closing one frees its place, and the refusals are one WARN line per listener.
func TestConnectionsPerAddressAreBounded(t *testing.T) {
	const max = 3
	_, grpcAddr, httpAddr, logs := floodServer(t, Options{Limits: Limits{MaxConnsPerAddress: max}})

	t.Run("grpc", func(t *testing.T) {
		served := func(h *h2raw) bool { // the server sent its SETTINGS: it serves this connection
			ev, ok := h.next(quiet)
			return ok && ev.err == nil && ev.typ == http2.FrameSettings
		}
		var held []*h2raw
		for range max {
			h := dialH2(t, grpcAddr, nil)
			require.True(t, served(h))
			held = append(held, h)
		}
		over := dialH2(t, grpcAddr, nil)
		ev, ok := over.next(quiet)
		require.True(t, ok, "the connection over the limit was left open")
		require.Error(t, ev.err, "the connection over the limit was served: %+v", ev)

		held[0].conn.Close()
		require.Eventually(t, func() bool { return served(dialH2(t, grpcAddr, nil)) }, 10*quiet, 10*time.Millisecond,
			"a closed connection's place is given back")
	})

	t.Run("http", func(t *testing.T) {
		get := func() (net.Conn, error) {
			c, err := net.Dial("tcp", httpAddr)
			if err != nil {
				return nil, err // reset before the dial returned
			}
			t.Cleanup(func() { c.Close() })
			_ = c.SetDeadline(time.Now().Add(quiet))
			if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"); err != nil {
				return c, err
			}
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				return c, err
			}
			resp.Body.Close()
			return c, nil
		}
		for range max {
			_, err := get() // kept alive: each holds its place
			require.NoError(t, err)
		}
		_, err := get()
		require.Error(t, err, "the connection over the limit was served")
	})

	local := "127.0.0.1"
	for _, listener := range []string{"grpc", "http"} {
		line := fmt.Sprintf(`level=WARN msg="refused a connection over the per-address limit" listener=%s peer=%s reason=max_connections_per_address refused=1`, listener, local)
		// The refused peer sees its reset before the line is written (Close, then note).
		require.Eventually(t, func() bool { return strings.Count(logs.String(), line) == 1 }, 10*quiet, 10*time.Millisecond, logs.String())
	}
}

// TestOversizedMessagesAreRefusedUnread: a message over MaxRecvMsgSize (4 MiB; grpc-go has
// one limit for every method) is refused RESOURCE_EXHAUSTED from its length prefix alone; from
// a caller without a key, UNAUTHENTICATED comes first, before the length is looked at.
func TestOversizedMessagesAreRefusedUnread(t *testing.T) {
	_, addr, _, _ := floodServer(t, Options{})
	h := dialH2(t, addr, nil)
	h.open(1, createServer, nil, 4<<20+1)
	h.open(3, createServer, map[string]string{auth.MetadataKey: floodAdminKey}, 4<<20+1)
	res, last := h.pump([]uint32{1, 3}, make([]byte, 32<<10), false, quiet)
	for id, want := range map[uint32]codes.Code{1: codes.Unauthenticated, 3: codes.ResourceExhausted} {
		require.NotNil(t, res[id].answer, "stream %d: no answer (last event %+v)", id, last)
		require.Equal(t, int(want), res[id].answer.grpcStatus(), "stream %d: %v", id, res[id].answer.fields)
		require.False(t, res[id].asked, "stream %d: the server asked for the body", id)
	}
}

// TestLargeMetadataIsResetUnread: request metadata over 64 KiB is reset before the stream is
// admitted (grpc-go's own bound is 16 MiB, all of it decoded first).
func TestLargeMetadataIsResetUnread(t *testing.T) {
	_, addr, _, _ := floodServer(t, Options{})
	h := dialH2(t, addr, nil)
	h.open(1, createServer, map[string]string{"x-filler": strings.Repeat("f", DefaultMaxHeaderBytes)}, 4<<20)
	h.open(3, createServer, map[string]string{"x-filler": strings.Repeat("f", 8<<10)}, 4<<20)
	res, last := h.pump([]uint32{1, 3}, nil, false, quiet)
	require.NotNil(t, res[1].answer, "no answer (last event %+v)", last)
	require.Equal(t, http2.FrameRSTStream, res[1].answer.typ, "%+v", res[1].answer)
	require.NotNil(t, res[3].answer, "no answer (last event %+v)", last)
	require.Equal(t, int(codes.Unauthenticated), res[3].answer.grpcStatus(), "metadata within the bound is read")
}

// TestKeepalivePolicy: a peer that pings more often than the policy allows is sent GOAWAY
// ENHANCE_YOUR_CALM; a connection that never completes its handshake is closed after
// HandshakeTimeout; and one with no admitted stream (refused ones do not count) is sent
// GOAWAY after IdleTimeout.
func TestKeepalivePolicy(t *testing.T) {
	_, addr, _, _ := floodServer(t, Options{Limits: Limits{HandshakeTimeout: 200 * time.Millisecond, IdleTimeout: 200 * time.Millisecond}})

	t.Run("ping flood", func(t *testing.T) {
		h := dialH2(t, addr, nil)
		for i := range 10 {
			if err := h.fr.WritePing(false, [8]byte{byte(i)}); err != nil {
				break // the server already closed
			}
		}
		requireGoAway(t, h, http2.ErrCodeEnhanceYourCalm, "too_many_pings")
	})

	t.Run("no handshake", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(quiet))
		buf := make([]byte, 512)
		for err == nil { // the server's SETTINGS, then the end
			_, err = c.Read(buf)
		}
		var ne net.Error
		require.False(t, errors.As(err, &ne) && ne.Timeout(), "the server kept a connection that sent no preface: %v", err)
	})

	t.Run("idle", func(t *testing.T) {
		h := dialH2(t, addr, nil)
		h.open(1, createServer, nil, 4<<20) // refused: it keeps nothing alive
		requireGoAway(t, h, http2.ErrCodeNo, "max_idle")
	})
}

func requireGoAway(t *testing.T, h *h2raw, code http2.ErrCode, debug string) {
	t.Helper()
	for {
		ev, ok := h.next(quiet)
		require.True(t, ok, "no GOAWAY")
		require.NoError(t, ev.err, "the connection ended without GOAWAY")
		h.answer(ev)
		if ev.typ == http2.FrameGoAway {
			require.Equal(t, code, ev.code)
			require.Equal(t, debug, ev.debug)
			return
		}
	}
}

// watchOnce answers Watch with one record, then holds the stream until the caller leaves.
type watchOnce struct {
	auditv1.UnimplementedAuditServiceServer
}

func (watchOnce) Watch(_ *auditv1.WatchRequest, ss grpc.ServerStreamingServer[auditv1.WatchResponse]) error {
	if err := ss.Send(&auditv1.WatchResponse{Record: &auditv1.Record{Kind: "admin"}}); err != nil {
		return err
	}
	<-ss.Context().Done()
	return nil
}

// TestRESTCallsAreNotCappedByTheStreamLimit: REST calls reach the gRPC server over one
// in-process connection, which the per-connection stream limit does not apply to; otherwise
// that many audit watches would stall every REST call behind them.
func TestRESTCallsAreNotCappedByTheStreamLimit(t *testing.T) {
	srv := New(Options{Name: "t", GRPCAddr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", Authorizer: allowAll{},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Limits: Limits{MaxStreamsPerConn: 2}})
	auditv1.RegisterAuditServiceServer(srv.GRPC(), watchOnce{})
	srv.AddGateway(func(ctx context.Context, mux *runtime.ServeMux, conn *grpc.ClientConn) error {
		return auditv1.RegisterAuditServiceHandler(ctx, mux, conn)
	})
	_, base := start(t, srv)
	ctx, cancel := context.WithTimeout(t.Context(), 2*quiet)
	defer cancel()
	var wg sync.WaitGroup
	lines := make(chan string, 5)
	for range 5 {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/audit/records:watch", nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				lines <- err.Error()
				return
			}
			defer resp.Body.Close()
			line, _ := bufio.NewReader(resp.Body).ReadString('\n')
			lines <- line
			<-ctx.Done() // the watch stays open until every one has its first record
		})
	}
	for range 5 {
		require.Contains(t, <-lines, `"kind":"admin"`)
	}
	cancel()
	wg.Wait()
}
