// Command embed shows the gates of Ringfence embedded in a Go program of its own, with
// nothing of Ringfence but the mcpgate module: it starts the demo docs server
// (examples/docs-mcp) over stdio, binds its tools, prints them, and makes two calls of
// read_doc, one the caller's capabilities allow and one the capability gate refuses before
// anything reaches the server, then one of search_docs, which it gave no permissions, so the
// gate refuses it whatever the caller holds (calls are default-deny).
//
//	go build -o /tmp/docs-mcp ./examples/docs-mcp
//	go run ./examples/embed -server /tmp/docs-mcp
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strings"

	"github.com/ringfence/ringfence/mcpgate"
)

func main() {
	server := flag.String("server", "docs-mcp", "path of the docs MCP server to run over stdio")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *server); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, server string) error {
	// The server gets no environment of ours but PATH.
	session, err := mcpgate.Command{Path: server}.Open(ctx)
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: build the demo server with `go build -o /tmp/docs-mcp ./examples/docs-mcp` and pass -server /tmp/docs-mcp", err)
	}
	if err != nil {
		return err
	}
	defer session.Close()

	// read_doc needs docs.read on the path it is asked for. The server's other tools are not
	// named, so no call of them is allowed: calls are default-deny. A tool that needs no
	// permission would be mapped to an empty list ("name": {}).
	specs, err := mcpgate.Bind(ctx, session, mcpgate.BindOptions{
		Permissions: map[string][]string{"read_doc": {"docs.read:{path}"}},
	})
	if err != nil {
		return err
	}
	var readDoc, searchDocs *mcpgate.ToolSpec
	for i, s := range specs {
		fmt.Printf("bound %s/%s v%s pin=%s permissions=[%s] side_effects=%s replay=%s findings=%d\n",
			s.Namespace, s.Name, s.Version, s.Pin, strings.Join(s.Permissions, " "), s.SideEffects, s.ReplayPolicy, len(s.Findings))
		switch s.Name {
		case "read_doc":
			readDoc = &specs[i]
		case "search_docs":
			searchDocs = &specs[i]
		}
	}
	if readDoc == nil || searchDocs == nil {
		return errors.New("the server has no read_doc or no search_docs tool")
	}

	// This caller may read the handbook, and nothing else.
	caps := mcpgate.Capabilities{Claims: []mcpgate.Claim{{Namespace: "docs.read", Scope: "/handbook/**"}}}

	res, err := mcpgate.CallTool(ctx, session, readDoc, map[string]any{"path": "/handbook/leave.md"}, caps)
	if err != nil {
		return err
	}
	fmt.Printf("allowed: %s\n", res.Content[0]["text"])

	_, err = mcpgate.CallTool(ctx, session, readDoc, map[string]any{"path": "/restricted/payroll.md"}, caps)
	var refused *mcpgate.CapabilityError
	if !errors.As(err, &refused) {
		return fmt.Errorf("the restricted read was not refused by the capability gate: %v", err)
	}
	fmt.Printf("refused: %v\n", refused)

	_, err = mcpgate.CallTool(ctx, session, searchDocs, map[string]any{"query": "leave"}, caps)
	if !errors.As(err, &refused) || !refused.Unpermissioned {
		return fmt.Errorf("search_docs, given no permissions, was not refused by the capability gate: %v", err)
	}
	fmt.Printf("refused: %v\n", refused)
	return nil
}
