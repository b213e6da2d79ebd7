package grpcserver

import (
	"context"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// RequestIDKey is the metadata key (and, through the gateway, the HTTP header X-Request-Id)
// that carries a request id. A caller's id is kept when it is sane; otherwise one is made.
const RequestIDKey = "x-request-id"

// saneRequestID reports whether a caller's id matches ^[A-Za-z0-9._-]{1,64}$; checked by hand
// because this runs on every request.
func saneRequestID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		switch c := id[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

type requestIDCtxKey struct{}

// requestInfo is what the context of a request carries for its access line: its id, and the
// attributes its handler added (LogAttrs).
type requestInfo struct {
	id string

	mu    sync.Mutex
	attrs []slog.Attr
}

func withRequestID(ctx context.Context) (context.Context, *requestInfo) {
	var rid string
	if v := metadata.ValueFromIncomingContext(ctx, RequestIDKey); len(v) > 0 && saneRequestID(v[0]) {
		rid = v[0]
	}
	if rid == "" {
		rid = newRequestID()
	}
	_ = grpc.SetHeader(ctx, metadata.MD{RequestIDKey: {rid}})
	info := &requestInfo{id: rid}
	return context.WithValue(ctx, requestIDCtxKey{}, info), info
}

// LogAttrs adds attributes to the access line of the request ctx belongs to (a tool call's
// call_id, attempt and run_id: what finds its audit records); nothing outside a request.
func LogAttrs(ctx context.Context, attrs ...slog.Attr) {
	info, ok := ctx.Value(requestIDCtxKey{}).(*requestInfo)
	if !ok {
		return
	}
	info.mu.Lock()
	info.attrs = append(info.attrs, attrs...)
	info.mu.Unlock()
}

// logAttrs returns the attributes handlers added, in the order added.
func (info *requestInfo) logAttrs() []slog.Attr {
	info.mu.Lock()
	defer info.mu.Unlock()
	return info.attrs
}

func newRequestID() string {
	var b [8]byte
	for i := range b {
		b[i] = byte(rand.Uint32())
	}
	return hex.EncodeToString(b[:])
}

// httpRequestID gives every HTTP response an X-Request-Id, the caller's when sane, also
// those no RPC answers (a refused key, an unknown route, /healthz, the export). It passes
// the id on in the request, so the RPC behind a route logs and answers the same one.
func httpRequestID(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rid := r.Header.Get("X-Request-Id")
		if !saneRequestID(rid) {
			rid = newRequestID()
			r.Header.Set("X-Request-Id", rid)
		}
		w.Header().Set("X-Request-Id", rid)
		h.ServeHTTP(w, r)
	})
}

// RequestID returns the id of the request ctx belongs to, or "" outside a request.
func RequestID(ctx context.Context) string {
	if info, ok := ctx.Value(requestIDCtxKey{}).(*requestInfo); ok {
		return info.id
	}
	return ""
}
