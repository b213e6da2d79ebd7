package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ringfence/ringfence/internal/discovery"
	"github.com/ringfence/ringfence/internal/mcpdecl"
	"github.com/ringfence/ringfence/internal/mcpdecl/screen"
	"github.com/ringfence/ringfence/internal/mcpserver"
	"github.com/ringfence/ringfence/services/pool/internal/spawner"
)

// Discover starts a registered server in isolation, takes its whole tool listing, stops it,
// and returns every tool with its pin, the screen's findings and whether the registration's
// tool filter excludes it. Every failure is a *discovery.Failure with a class, or
// discovery.ErrIsolationRequired; no container outlives the call.
func (s *Service) DiscoverTools(ctx context.Context, ref string) (*discovery.Listing, error) {
	reg, err := s.cfg.Registry.ResolveRegistration(ctx, ref)
	if err != nil {
		return nil, err
	}
	sess, err := s.spawner.Spawn(ctx, specFor(reg, spawner.PurposeDiscovery, ""))
	if err != nil {
		return nil, spawnFailure(err)
	}
	defer sess.Close(context.WithoutCancel(ctx))
	tools, err := sess.ListTools(ctx)
	if err != nil {
		return nil, spawnFailure(err)
	}
	return Screen(reg, tools)
}

// specFor turns a resolved registration into what the spawner starts.
func specFor(reg *mcpserver.Resolved, purpose, runID string) spawner.Spec {
	return spawner.Spec{
		ServerRef:        reg.Ref,
		Transport:        reg.Transport,
		Command:          reg.Command,
		Args:             reg.Args,
		Env:              reg.Env,
		URL:              reg.URL,
		Headers:          reg.HeaderValues,
		HandshakeTimeout: reg.SessionTimeout(),
		Purpose:          purpose,
		RunID:            runID,
	}
}

// Screen pins and screens a live listing under a registration. The pin covers the raw
// declaration; screening never changes it.
func Screen(reg *mcpserver.Resolved, tools []*mcp.Tool) (*discovery.Listing, error) {
	decls := make([]mcpdecl.Declaration, 0, len(tools))
	for _, t := range tools {
		d, err := mcpdecl.FromTool(t)
		if err != nil {
			return nil, &discovery.Failure{Class: string(spawner.ClassProtocolViolation), Message: fmt.Sprintf("tool %q cannot be read: %v", truncate(t.Name), err)}
		}
		decls = append(decls, d)
	}
	report := screen.Screen(decls, screen.Context{})
	listing := &discovery.Listing{ServerRef: reg.Ref, Revision: reg.Revision, Findings: findings(report.Listing)}
	for i, d := range decls {
		tool := discovery.Tool{
			Name: d.Name, Title: d.Title, Description: d.Description,
			InputSchema: d.InputSchema, OutputSchema: d.OutputSchema, Annotations: d.Annotations,
			Findings: findings(report.Tools[i].Findings),
			Excluded: !reg.Filter.Allows(d.Name),
		}
		if h, err := mcpdecl.Hash(d); err == nil {
			tool.SchemaHash = h
		}
		listing.Tools = append(listing.Tools, tool)
	}
	return listing, nil
}

func findings(fs []screen.Finding) []discovery.Finding {
	out := make([]discovery.Finding, len(fs))
	for i, f := range fs {
		out[i] = discovery.Finding{Code: f.Code, Severity: f.Severity.String(), Location: f.Location, Message: f.Message}
	}
	return out
}

// spawnFailure turns a spawner error into the classified discovery failure callers see.
func spawnFailure(err error) error {
	var se *spawner.Error
	if !errors.As(err, &se) {
		return err // context errors pass through
	}
	if se.Class == spawner.ClassIsolationRequired {
		return discovery.ErrIsolationRequired
	}
	return &discovery.Failure{Class: string(se.Class), Message: se.Message, StderrTail: se.StderrTail}
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:61] + "..."
	}
	return s
}
