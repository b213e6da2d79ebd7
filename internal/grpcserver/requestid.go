package grpcserver

import (
	"context"
	"encoding/hex"
	"math/rand/v2"
	"regexp"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// RequestIDKey is the metadata key (and, through the gateway, the HTTP header X-Request-Id)
// that carries a request id. A caller's id is kept when it is sane; otherwise one is made.
const RequestIDKey = "x-request-id"

var requestIDPattern = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

type requestIDCtxKey struct{}

func withRequestID(ctx context.Context) (context.Context, string) {
	var rid string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(RequestIDKey); len(v) > 0 && requestIDPattern.MatchString(v[0]) {
			rid = v[0]
		}
	}
	if rid == "" {
		var b [8]byte
		for i := range b {
			b[i] = byte(rand.Uint32())
		}
		rid = hex.EncodeToString(b[:])
	}
	_ = grpc.SetHeader(ctx, metadata.Pairs(RequestIDKey, rid))
	return context.WithValue(ctx, requestIDCtxKey{}, rid), rid
}

// RequestID returns the id of the request ctx belongs to, or "" outside a request.
func RequestID(ctx context.Context) string {
	rid, _ := ctx.Value(requestIDCtxKey{}).(string)
	return rid
}
