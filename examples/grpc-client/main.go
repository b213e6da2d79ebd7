// Command grpc-client is a Go client of Ringfence's public gRPC API built on the generated
// stubs alone (module github.com/ringfence/ringfence/gen/go: grpc, protobuf and the
// gateway's runtime, nothing of the servers): it sends the API key with every RPC, speaks TLS to a server whose
// certificate chains to -ca-file and names the -server-identity service, and lists the
// registered MCP servers page by page.
//
//	RINGFENCE_API_KEY=… go run ./examples/grpc-client -addr 127.0.0.1:50051
//	RINGFENCE_API_KEY=… go run ./examples/grpc-client -addr registry.internal:50051 -ca-file ca.pem -server-identity registry
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	registryv1 "github.com/ringfence/ringfence/gen/go/ringfence/registry/v1"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:50051", "the server's gRPC host:port (a split deployment: the registry's public port)")
	caFile := flag.String("ca-file", "", "the PEM `file` of the CA the server's certificate chains to (ringfence certs init writes ca.pem); empty: plaintext, loopback only")
	identity := flag.String("server-identity", "registry", "with -ca-file, the service the server's certificate must name")
	flag.Parse()
	if err := run(context.Background(), *addr, *caFile, *identity, os.Getenv("RINGFENCE_API_KEY")); err != nil {
		fmt.Fprintln(os.Stderr, "grpc-client:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, addr, caFile, identity, key string) error {
	if key == "" {
		return errors.New("set RINGFENCE_API_KEY to an API key whose role has mcp:admin")
	}
	creds := insecure.NewCredentials()
	if caFile != "" {
		var err error
		if creds, err = serverTLS(caFile, identity); err != nil {
			return err
		}
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
		grpc.WithPerRPCCredentials(apiKey{key: key, tls: caFile != ""}))
	if err != nil {
		return err
	}
	defer conn.Close()

	registry := registryv1.NewRegistryServiceClient(conn)
	var token string
	for {
		page, err := registry.ListServers(ctx, &registryv1.ListServersRequest{PageSize: 100, PageToken: token})
		if err != nil {
			return describe(err)
		}
		for _, s := range page.GetServers() {
			fmt.Printf("%s\t%s\tgrants=%v\n", s.GetRef(), s.GetTransport(), s.GetGrants())
		}
		if token = page.GetNextPageToken(); token == "" {
			return nil
		}
	}
}

// apiKey sends the key as the x-api-key metadata of every RPC. Over plaintext it travels in
// clear: keep that to loopback.
type apiKey struct {
	key string
	tls bool
}

func (k apiKey) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"x-api-key": k.key}, nil
}

func (k apiKey) RequireTransportSecurity() bool { return k.tls }

// serverTLS trusts the CA in caFile and, since every service's certificate chains to it and
// names the same hosts, accepts only the certificate of the service named identity
// (URI SAN spiffe://ringfence/service/<identity>): no other service receives the key. The
// public port asks for no client certificate; the internal listener takes service
// certificates only, never an API key.
func serverTLS(caFile, identity string) (credentials.TransportCredentials, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", caFile)
	}
	want := "spiffe://ringfence/service/" + identity
	return credentials.NewTLS(&tls.Config{
		RootCAs:    roots,
		MinVersion: tls.VersionTLS13,
		VerifyConnection: func(cs tls.ConnectionState) error {
			leaf := cs.PeerCertificates[0]
			if !slices.ContainsFunc(leaf.URIs, func(u *url.URL) bool { return u.String() == want }) {
				return fmt.Errorf("the server's certificate does not name %s: point -addr at the %s service", want, identity)
			}
			return nil
		},
	}), nil
}

// describe adds a refusal's field violations (google.rpc.BadRequest) to its message.
func describe(err error) error {
	st := status.Convert(err)
	msg := fmt.Sprintf("%s: %s", st.Code(), st.Message())
	for _, d := range st.Details() {
		if br, ok := d.(*errdetails.BadRequest); ok {
			for _, v := range br.GetFieldViolations() {
				msg += fmt.Sprintf("\n  %s: %s", v.GetField(), v.GetDescription())
			}
		}
	}
	return errors.New(msg)
}
