package grpcserver

import (
	"context"
	"strconv"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// WarningHeader is the gRPC response header that carries a response's warnings, one value
// each. The REST gateway sends each as an HTTP Warning header (RFC 7234 code 299, a
// persistent warning, as Kubernetes sends its API warnings), so that a REST client whose body
// is fixed in shape (the seed's registration object) still receives them.
const WarningHeader = "ringfence-warning"

// SetWarnings sends warnings as response headers of the RPC ctx belongs to, quoted as an HTTP
// Warning value: `299 - "text"`, in ASCII (metadata holds nothing else). A caller in the same
// process has no stream to send them on; it reads them from the response.
func SetWarnings(ctx context.Context, warnings ...string) {
	if len(warnings) == 0 {
		return
	}
	md := metadata.MD{}
	for _, w := range warnings {
		md.Append(WarningHeader, "299 - "+strconv.QuoteToASCII(w))
	}
	_ = grpc.SetHeader(ctx, md)
}
