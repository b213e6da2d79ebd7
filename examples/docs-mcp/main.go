// Command docs-mcp is the MCP server of Ringfence's demo (`make run`): a small handbook
// search over stdio. It is ordinary MCP code with no knowledge of Ringfence; the demo builds it
// static into a FROM-scratch isolation image and governs it: read_doc is registered with an
// argument-scoped permission, so an agent may read only the paths its capabilities cover.
// read_upload reads a document the caller uploaded, given its bytes (base64): with Ringfence a
// model names a stored document as my-documents://<id>, and the gateway puts its content there.
package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"unicode/utf8"

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

type uploadIn struct {
	Content string `json:"content" jsonschema:"the document's bytes, base64 (standard, padded)"`
}

type uploadOut struct {
	Bytes int    `json:"bytes"`
	Text  string `json:"text"`
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
	mcp.AddTool(s, &mcp.Tool{Name: "read_upload", Description: "Return the text of an uploaded document, given its content."},
		func(_ context.Context, _ *mcp.CallToolRequest, in uploadIn) (*mcp.CallToolResult, uploadOut, error) {
			b, err := base64.StdEncoding.DecodeString(in.Content)
			if err != nil {
				return nil, uploadOut{}, fmt.Errorf("content is not base64: %v", err)
			}
			if !utf8.Valid(b) {
				return nil, uploadOut{}, fmt.Errorf("the document (%d bytes) is not text", len(b))
			}
			return nil, uploadOut{Bytes: len(b), Text: string(b)}, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		log.Printf("docs-mcp: %v", err)
		os.Exit(1)
	}
}
