// Command docs-mcp is the MCP server of Ringfence's demo (`make run`): a small handbook
// search over stdio. It is ordinary MCP code with no knowledge of Ringfence; the demo builds it
// static into a FROM-scratch isolation image and governs it: read_doc is registered with an
// argument-scoped permission, so an agent may read only the paths its capabilities cover.
package main

import (
	"context"
	"log"
	"os"
	"sort"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// docs is the demo's corpus, by path.
var docs = map[string]string{
	"/handbook/leave.md":       "Employees accrue 2 days of leave per month. Ask your manager in the leave tool.",
	"/handbook/expenses.md":    "Submit expenses within 30 days with receipts attached.",
	"/handbook/onboarding.md":  "Week one: accounts, laptop, and a buddy. Week two: shadow support.",
	"/restricted/payroll.md":   "Payroll run dates and salary bands (restricted).",
	"/restricted/incidents.md": "Open security incidents (restricted).",
}

type searchIn struct {
	Query string `json:"query" jsonschema:"words to look for"`
}

type searchOut struct {
	Paths []string `json:"paths"`
}

type readIn struct {
	Path string `json:"path" jsonschema:"the document's path, e.g. /handbook/leave.md"`
}

func main() {
	s := mcp.NewServer(&mcp.Implementation{Name: "docs-mcp", Version: "1.0.0"}, nil)
	mcp.AddTool(s, &mcp.Tool{Name: "search_docs", Description: "Find handbook documents whose text contains the query."},
		func(_ context.Context, _ *mcp.CallToolRequest, in searchIn) (*mcp.CallToolResult, searchOut, error) {
			out := searchOut{Paths: []string{}}
			for path, text := range docs {
				if strings.Contains(strings.ToLower(text+" "+path), strings.ToLower(in.Query)) {
					out.Paths = append(out.Paths, path)
				}
			}
			sort.Strings(out.Paths)
			return nil, out, nil
		})
	mcp.AddTool(s, &mcp.Tool{Name: "read_doc", Description: "Return the text of one document."},
		func(_ context.Context, _ *mcp.CallToolRequest, in readIn) (*mcp.CallToolResult, any, error) {
			text, ok := docs[in.Path]
			if !ok {
				return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: "no such document: " + in.Path}}}, nil, nil
			}
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}, nil, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		log.Printf("docs-mcp: %v", err)
		os.Exit(1)
	}
}
