// Package telemetry is Ringfence's tracing: an OpenTelemetry span for every gRPC call a binary
// serves or makes to a peer, with the W3C trace context (`traceparent`) carried on every call
// between services, so that one request's path through registry, publisher, pool and audit is
// one trace. It uses the maintained gRPC instrumentation (otelgrpc). Nothing is recorded or
// exported unless an OTLP endpoint is configured (RINGFENCE_OTEL__ENDPOINT); a nil *Tracing is
// tracing off, and costs nothing.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
)

// Tracing records spans with one TracerProvider. The zero of a pointer (nil) is tracing off.
type Tracing struct {
	provider trace.TracerProvider
	shutdown func(context.Context) error
}

// propagator is the W3C trace context, set explicitly: the process-wide default propagator
// of OpenTelemetry carries nothing.
var propagator = propagation.TraceContext{}

// New traces with provider (tests pass an SDK provider with an in-memory span recorder).
func New(provider trace.TracerProvider) *Tracing { return &Tracing{provider: provider} }

// Start exports spans over OTLP/gRPC to endpoint, a URL such as http://collector:4317 (http is
// plaintext, https verifies the collector with the system roots), naming this process
// service. Spans are batched in memory and sent in the background: a collector that is down
// costs dropped spans, never a slower call. Shutdown flushes them.
func Start(ctx context.Context, endpoint, service string) (*Tracing, error) {
	if err := CheckEndpoint(endpoint); err != nil {
		return nil, err
	}
	exp, err := otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(endpoint))
	if err != nil {
		return nil, fmt.Errorf("telemetry: OTLP exporter for %s: %w", endpoint, err)
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(resource.NewSchemaless(attribute.String("service.name", service))),
	)
	return &Tracing{provider: tp, shutdown: tp.Shutdown}, nil
}

// CheckEndpoint says what is wrong with an OTLP endpoint, or nil.
func CheckEndpoint(endpoint string) error {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("telemetry: the OTLP endpoint must be an http:// or https:// URL with a host, e.g. http://127.0.0.1:4317 (OTLP over gRPC)")
	}
	return nil
}

// Shutdown flushes spans not yet exported, within ctx.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return t.shutdown(ctx)
}

func (t *Tracing) options() []otelgrpc.Option {
	return []otelgrpc.Option{
		otelgrpc.WithTracerProvider(t.provider),
		otelgrpc.WithPropagators(propagator),
		// Metrics come from the servers' own Prometheus registry.
		otelgrpc.WithMeterProvider(noop.NewMeterProvider()),
	}
}

// ServerOptions instrument a gRPC server. A public server (the port API keys reach) starts a
// trace of its own for every call and only links the caller's trace context, which a stranger
// chooses; the internal listener, where only service certificates connect, continues it.
func (t *Tracing) ServerOptions(public bool) []grpc.ServerOption {
	if t == nil {
		return nil
	}
	opts := t.options()
	if public {
		opts = append(opts, otelgrpc.WithPublicEndpoint())
	}
	return []grpc.ServerOption{grpc.StatsHandler(otelgrpc.NewServerHandler(opts...))}
}

// DialOptions instrument a client connection to a peer: each call is a client span, and its
// trace context travels in the call's metadata as `traceparent`.
func (t *Tracing) DialOptions() []grpc.DialOption {
	if t == nil {
		return nil
	}
	return []grpc.DialOption{grpc.WithStatsHandler(otelgrpc.NewClientHandler(t.options()...))}
}
