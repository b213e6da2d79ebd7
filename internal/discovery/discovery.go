// Package discovery is the shape of a tool listing taken from a live MCP server, shared by the
// pool (which takes it), the registry (which shows it to operators) and the publisher (which
// pins it on import), and the classified ways taking one can fail.
package discovery

import (
	"encoding/json"
	"errors"
	"fmt"

	registryinternalv1 "github.com/ringfence/ringfence/gen/go/ringfence/internalapi/registry/v1"
	typesv1 "github.com/ringfence/ringfence/gen/go/ringfence/types/v1"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// Tool is one declared tool as the server sent it, with its pin and the screen's findings.
type Tool struct {
	Name         string
	Title        string
	Description  string
	InputSchema  json.RawMessage
	OutputSchema json.RawMessage
	Annotations  json.RawMessage
	// SchemaHash pins the raw declaration ("v1:sha256:<hex>").
	SchemaHash string
	Findings   []Finding
	// Excluded is true when the registration's tool filter removes the tool.
	Excluded bool
}

// HasHardFailure reports whether the screen found the declaration unrepresentable.
func (t Tool) HasHardFailure() bool {
	for _, f := range t.Findings {
		if f.Severity == SeverityHardFailure {
			return true
		}
	}
	return false
}

// Finding severities.
const (
	SeverityHardFailure = "hard_failure"
	SeverityFlag        = "flag"
)

// Finding is one result of the declaration screen. The JSON tags are the stored form of the
// flags the publisher keeps on mcp_tool nodes.
type Finding struct {
	Code     string `json:"code"`
	Severity string `json:"severity"`
	Location string `json:"location,omitempty"`
	Message  string `json:"message,omitempty"`
}

// FromScreen converts the declaration screen's findings into their listed and stored form.
func FromScreen(fs []screen.Finding) []Finding {
	if len(fs) == 0 {
		return nil
	}
	out := make([]Finding, len(fs))
	for i, f := range fs {
		out[i] = Finding{Code: f.Code, Severity: f.Severity.String(), Location: f.Location, Message: f.Message}
	}
	return out
}

// Listing is every tool of one server at one registration revision.
type Listing struct {
	ServerRef string
	Revision  int64
	Tools     []Tool
	// Findings about the listing as a whole (too many tools, duplicate names).
	Findings []Finding
}

// ErrIsolationRequired refuses to start a stdio server when no isolation image is configured.
var ErrIsolationRequired = errors.New("isolation required: set RINGFENCE_SANDBOX__MCP_ISOLATION_IMAGE to a pinned image (name@sha256:<64 hex> or sha256:<64 hex>; `ringfence image build` makes one); Ringfence never falls back to running MCP servers on the host")

// Failure classes: every way of failing to reach a server.
const (
	ClassIsolationRequired     = "isolation_required"
	ClassImageMissing          = "image_missing"
	ClassCommandNotFound       = "command_not_found"
	ClassExitedBeforeHandshake = "exited_before_handshake"
	ClassNotMCPServer          = "not_mcp_server"
	ClassHandshakeTimeout      = "handshake_timeout"
	ClassCrashed               = "crashed"
	ClassConnectionRefused     = "connection_refused"
	ClassTLSFailure            = "tls_failure"
	ClassSpawnFailed           = "spawn_failed"
	ClassImageRejected         = "image_rejected"
	ClassInvalidSpec           = "invalid_spec"
	ClassProtocolViolation     = "protocol_violation"
	ClassTimeout               = "timeout"
	ClassLimitExceeded         = "limit_exceeded"
	// ClassSignInRequired: the server signs each user in, and the listing was asked for no
	// user, or one who has not connected it (docs/oauth.md).
	ClassSignInRequired = "sign_in_required"
)

// Failure is a classified failure to reach or list a server. Message and StderrTail are safe to
// show to administrators: secrets are redacted before a Failure is built.
type Failure struct {
	Class      string
	Message    string
	StderrTail string
}

func (f *Failure) Error() string { return fmt.Sprintf("%s: %s", f.Class, f.Message) }

// AsFailure returns the Failure inside err, if any.
func AsFailure(err error) (*Failure, bool) {
	var f *Failure
	ok := errors.As(err, &f)
	return f, ok
}

// ExploreRequest asks for a listing of a registered server and, when Call is set, one call of
// a listed tool on the same isolated session (ringfence servers explore --call).
type ExploreRequest struct {
	Ref  string
	Call *typesv1.ExploreCall
	// Adhoc, when set, is explored instead of the registration Ref names: a server the
	// registry validated and resolved (as its ResolveServer answers) but never stored.
	Adhoc *registryinternalv1.ResolveServerResponse
	// Tenant and ActorKeyID say whose call it is, for its audit record; Actor names the
	// caller as a person reads it (auth.Principal.Actor), the record's agent_node.
	Tenant, ActorKeyID, Actor string
	// User, for a server that signs each user in, is the user of Tenant whose token lists its
	// tools, as the server declares them to that user (an import for that user's runs).
	User string
}
