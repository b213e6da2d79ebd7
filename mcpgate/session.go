package mcpgate

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// ProtocolVersion is the MCP version the helpers ask for. Pinning it makes the client open
// with initialize, which every server speaks; a newer default may first send a request a
// stdio server that ignores unknown methods never answers.
const ProtocolVersion = "2025-11-25"

// ClientSession is a go-sdk client session as a Session. Close ends it (and stops the
// command OpenCommand started).
type ClientSession struct {
	*mcp.ClientSession
}

var _ Session = ClientSession{}

// Initialize returns the server's answer to the initialize the session made when it
// connected.
func (s ClientSession) Initialize(context.Context) (*mcp.InitializeResult, error) {
	if s.ClientSession == nil {
		return nil, errors.New("mcpgate: the ClientSession holds no go-sdk session: connect with Connect, OpenCommand or OpenStreamableHTTP, or wrap the *mcp.ClientSession you connected")
	}
	if r := s.InitializeResult(); r != nil {
		return r, nil
	}
	return nil, errors.New("mcpgate: the session has not been initialized")
}

// NewClient is the MCP client the helpers connect with. It advertises nothing (no roots,
// sampling or elicitation for a server to ask for) and never re-sends a call on its own: each
// call passes the gate exactly once.
func NewClient() *mcp.Client {
	return mcp.NewClient(&mcp.Implementation{Name: "mcpgate", Version: Version}, &mcp.ClientOptions{
		Capabilities:   &mcp.ClientCapabilities{},
		MultiRoundTrip: &mcp.MultiRoundTripOptions{Disabled: true},
	})
}

// Connect runs the MCP handshake over transport (e.g. one end of mcp.NewInMemoryTransports).
func Connect(ctx context.Context, transport mcp.Transport) (ClientSession, error) {
	return connect(ctx, transport, "connect")
}

// connect is Connect, its error naming what was connected to.
func connect(ctx context.Context, transport mcp.Transport, what string) (ClientSession, error) {
	cs, err := NewClient().Connect(ctx, transport, &mcp.ClientSessionOptions{ProtocolVersion: ProtocolVersion})
	if err != nil {
		return ClientSession{}, fmt.Errorf("mcpgate: %s: %w", what, err)
	}
	return ClientSession{cs}, nil
}

// OpenCommand starts cmd and connects to it over its stdin and stdout (its stderr is left as
// cmd says). Closing the session closes the command's stdin and waits for it to exit,
// terminating it when it does not.
func OpenCommand(ctx context.Context, cmd *exec.Cmd) (ClientSession, error) {
	return connect(ctx, &mcp.CommandTransport{Command: cmd}, cmd.Path)
}

// OpenStreamableHTTP connects to a streamable HTTP MCP endpoint. client carries any
// credentials (nil means http.DefaultClient).
func OpenStreamableHTTP(ctx context.Context, endpoint string, client *http.Client) (ClientSession, error) {
	return connect(ctx, &mcp.StreamableClientTransport{Endpoint: endpoint, HTTPClient: client}, endpoint)
}
