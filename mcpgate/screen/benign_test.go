package screen_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// Schemas shaped like those of the reference filesystem MCP server
// (zod-generated, draft-07, additionalProperties false); descriptions in
// the same ordinary register.
func filesystemListing() []mcpdecl.Declaration {
	const meta = `"$schema":"http://json-schema.org/draft-07/schema#","additionalProperties":false`
	pathOnly := `{"type":"object","properties":{"path":{"type":"string"}},"required":["path"],` + meta + `}`
	ro := json.RawMessage(`{"readOnlyHint":true}`)
	return []mcpdecl.Declaration{
		{
			Name:         "read_text_file",
			Title:        "Read Text File",
			Description:  "Read the complete contents of a file from the file system as text. Handles various text encodings and provides detailed error messages if the file cannot be read. Use the 'head' parameter to read only the first N lines of a file, or the 'tail' parameter to read only the last N lines. Only works within allowed directories.",
			InputSchema:  json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"tail":{"type":"number","description":"If provided, returns only the last N lines of the file"},"head":{"type":"number","description":"If provided, returns only the first N lines of the file"}},"required":["path"],` + meta + `}`),
			OutputSchema: json.RawMessage(`{"type":"object","properties":{"content":{"type":"string"}},"required":["content"],` + meta + `}`),
			Annotations:  ro,
		},
		{
			Name:        "read_multiple_files",
			Description: "Read the contents of multiple files simultaneously. This is more efficient than reading files one by one when you need to analyze or compare multiple files. Each file's content is returned with its path as a reference. Failed reads for individual files won't stop the entire operation. Only works within allowed directories.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"paths":{"type":"array","items":{"type":"string"},"minItems":1,"description":"Array of file paths to read. Each path must be a string pointing to a valid file within allowed directories."}},"required":["paths"],` + meta + `}`),
			Annotations: ro,
		},
		{
			Name:        "write_file",
			Description: "Create a new file or completely overwrite an existing file with new content. Use with caution as it will overwrite existing files without warning. Handles text content with proper encoding. Only works within allowed directories.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"}},"required":["path","content"],` + meta + `}`),
			Annotations: json.RawMessage(`{"readOnlyHint":false,"idempotentHint":true,"destructiveHint":true}`),
		},
		{
			Name:        "edit_file",
			Description: "Make line-based edits to a text file. Each edit replaces exact line sequences with new content. Returns a git-style diff showing the changes made. Only works within allowed directories.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"edits":{"type":"array","items":{"type":"object","properties":{"oldText":{"type":"string","description":"Text to search for - must match exactly"},"newText":{"type":"string","description":"Text to replace with"}},"required":["oldText","newText"],"additionalProperties":false}},"dryRun":{"type":"boolean","default":false,"description":"Preview changes using git-style diff format"}},"required":["path","edits"],` + meta + `}`),
			Annotations: json.RawMessage(`{"readOnlyHint":false,"destructiveHint":true}`),
		},
		{
			Name:        "create_directory",
			Description: "Create a new directory or ensure a directory exists. Can create multiple nested directories in one operation. If the directory already exists, this operation will succeed silently. Perfect for setting up directory structures for projects or ensuring required paths exist. Only works within allowed directories.",
			InputSchema: json.RawMessage(pathOnly),
			Annotations: json.RawMessage(`{"readOnlyHint":false,"idempotentHint":true,"destructiveHint":false}`),
		},
		{
			Name:        "list_directory",
			Description: "Get a detailed listing of all files and directories in a specified path. Results clearly distinguish between files and directories with [FILE] and [DIR] prefixes. This tool is essential for understanding directory structure and finding specific files within a directory. Only works within allowed directories.",
			InputSchema: json.RawMessage(pathOnly),
			Annotations: ro,
		},
		{
			Name:        "directory_tree",
			Description: "Get a recursive tree view of files and directories as a JSON structure. Each entry includes 'name', 'type' (file/directory), and 'children' for directories. Files have no children array, while directories always have a children array (which may be empty). The output is formatted with 2-space indentation for readability. Only works within allowed directories.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"excludePatterns":{"type":"array","items":{"type":"string"},"default":[]}},"required":["path"],` + meta + `}`),
			Annotations: ro,
		},
		{
			Name:        "move_file",
			Description: "Move or rename files and directories. Can move files between directories and rename them in a single operation. If the destination exists, the operation will fail. Works across different directories and can be used for simple renaming within the same directory. Both source and destination must be within allowed directories.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"source":{"type":"string"},"destination":{"type":"string"}},"required":["source","destination"],` + meta + `}`),
			Annotations: json.RawMessage(`{"readOnlyHint":false,"destructiveHint":false}`),
		},
		{
			Name:        "search_files",
			Description: "Recursively search for files and directories matching a pattern. The patterns should be glob-style patterns that match paths relative to the working directory. Use pattern like '*.ext' to match files in current directory, and '**/*.ext' to match files in all subdirectories. Returns full paths to all matching items. Great for finding files when you don't know their exact location. Only searches within allowed directories.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{"path":{"type":"string"},"pattern":{"type":"string"},"excludePatterns":{"type":"array","items":{"type":"string"},"default":[]}},"required":["path","pattern"],` + meta + `}`),
			Annotations: ro,
		},
		{
			Name:        "get_file_info",
			Description: "Retrieve detailed metadata about a file or directory. Returns comprehensive information including size, creation time, last modified time, permissions, and type. This tool is perfect for understanding file characteristics without reading the actual content. Only works within allowed directories.",
			InputSchema: json.RawMessage(pathOnly),
			Annotations: ro,
		},
		{
			Name:        "list_allowed_directories",
			Description: "Returns the list of directories that this server is allowed to access. Subdirectories within these allowed directories are also accessible. Use this to understand which directories and their nested paths are available before trying to access files.",
			InputSchema: json.RawMessage(`{"type":"object","properties":{},"required":[]}`),
			Annotations: ro,
		},
	}
}

// otherServers is a realistic registry around the filesystem server.
var otherServers = screen.Context{OtherNames: []string{
	"github", "create_issue", "get_file_contents", "push_files", "search_repositories", "create_pull_request",
	"slack", "slack_post_message", "slack_list_channels", "memory", "create_entities", "search_nodes",
	"brave-search", "brave_web_search", "puppeteer", "puppeteer_navigate", "puppeteer_screenshot", "git",
	"git_status", "git_commit", "time", "get_current_time", "sequentialthinking",
}}

func TestFilesystemServerRaisesNoFlags(t *testing.T) {
	rep := screen.Screen(filesystemListing(), otherServers)
	require.Empty(t, rep.Listing)
	for _, tool := range rep.Tools {
		require.False(t, tool.Refused, tool.Name)
		require.Empty(t, tool.Findings, "%s: %v", tool.Name, tool.Findings)
	}
}

func TestOrdinaryDescriptionsRaiseNoFlags(t *testing.T) {
	for i, text := range []string{
		"Counts the tokens in a text using the model's tokenizer. Returns the token count and the token ids.",
		"Tokenize the input and return one token per line.",
		"Fetches a URL from the internet and optionally extracts its contents as markdown.",
		"Deletes the file if it exists; silently ignores missing files.",
		"Creates the directory, succeeding silently when it already exists.",
		"Returns the latency in µs and the drift Δt between two clocks; π is approximated.",
		"Looks up the current weather for a city. Requires an API key configured on the server.",
		"Reads configuration from process.env and config.yaml.",
		"Search issues by label. Results are sorted by update time.",
		"Sends a chat message to a channel you name.",
		"Executes a read-only SQL query against the analytics database and returns rows as JSON.",
		"Set the password policy (minimum length, expiry) for the tenant.",
		"Path like /home/<user>/notes.txt; use ~ for the home directory.",
		"Returns an access token's expiry time, not the token itself.",
		"日本語のテキストをAPIで翻訳します。",
		"Gibt die Datei zurück. Größe in Bytes.",
		"Формирует отчёт о продажах за период.",
		"Remember: the result is cached for 5 minutes. Important: paths are case-sensitive.",
		"Use <b>bold</b> or <i>italic</i> markup in the message body.",
		"Before you start, call list_allowed_directories to see which paths are permitted.",
		"Ignores whitespace-only lines in the diff.",
		"Disregards hidden files unless include_hidden is true.",
		"Run tests with the given pattern and report failures.",
		"Compute the SHA-256 digest, e.g. 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.",
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			d := base()
			d.Description = text
			tool := screen.ScreenTool(d, otherServers)
			require.Empty(t, tool.Findings, "%q: %v", text, tool.Findings)
		})
	}
}

func TestCrossReferenceNegatives(t *testing.T) {
	ctx := screen.Context{OtherNames: []string{"search", "echo", "add", "github__create_issue", "read_file"}}
	for _, text := range []string{
		"Searches the catalogue.",  // inflection of "search", not a look-alike
		"Adds numbers and echoes.", // names under 5 letters are everyday words
		"Reads the file.",
	} {
		d := base()
		d.Description = text
		tool := screen.ScreenTool(d, ctx)
		_, found := find(tool.Findings, screen.CodeCrossReference)
		require.False(t, found, "%q: %v", text, tool.Findings)
	}

	// A listing's own names are never "other", even when the caller passes them.
	decls := []mcpdecl.Declaration{
		with(func(d *mcpdecl.Declaration) {
			d.Name = "read_file"
			d.Description = "Read one file; for many use read_files."
		}),
		with(func(d *mcpdecl.Declaration) {
			d.Name = "read_files"
			d.Description = "Read many files; for one use read_file."
		}),
	}
	rep := screen.Screen(decls, screen.Context{OtherNames: []string{"read_file", "read_files"}})
	for _, tool := range rep.Tools {
		_, found := find(tool.Findings, screen.CodeCrossReference)
		require.False(t, found, "%v", tool.Findings)
	}
	// The collision itself is still reported.
	_, found := find(rep.Tools[0].Findings, screen.CodeNameCollision)
	require.True(t, found)
}

func TestAnnotationMismatchNegatives(t *testing.T) {
	for _, name := range []string{"list_posts", "get_update", "read_file", "search_messages", "get_settings"} {
		d := base()
		d.Name = name
		d.Annotations = json.RawMessage(`{"readOnlyHint":true}`)
		tool := screen.ScreenTool(d, screen.Context{})
		require.Empty(t, tool.Findings, "%s: %v", name, tool.Findings)
	}
	d := base()
	d.Name = "delete_file"
	d.Annotations = json.RawMessage(`{"readOnlyHint":false,"destructiveHint":true}`)
	require.Empty(t, screen.ScreenTool(d, screen.Context{}).Findings)
}

// everythingServer registers the tools of the go-sdk "everything" example
// (examples/server/everything, v1.8.0) with the same names, descriptions
// and argument types.
func everythingServer() *mcp.Server {
	type args struct {
		Name string `json:"name" jsonschema:"the name to say hi to"`
	}
	type result struct {
		Message string `json:"message" jsonschema:"the message to convey"`
	}
	content := func(context.Context, *mcp.CallToolRequest, args) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	}
	structured := func(context.Context, *mcp.CallToolRequest, *args) (*mcp.CallToolResult, *result, error) {
		return nil, &result{}, nil
	}
	noArgs := func(context.Context, *mcp.CallToolRequest, any) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{}, nil, nil
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	server := mcp.NewServer(&mcp.Implementation{Name: "everything"}, &mcp.ServerOptions{Logger: quiet})
	mcp.AddTool(server, &mcp.Tool{Name: "greet", Description: "say hi"}, content)
	mcp.AddTool(server, &mcp.Tool{Name: "greet (structured)"}, structured)
	mcp.AddTool(server, &mcp.Tool{Name: "greet (with Icons)"}, structured)
	mcp.AddTool(server, &mcp.Tool{Name: "greet (content with ResourceLink)"}, content)
	for _, name := range []string{"ping", "log", "sample", "elicit (form)", "elicit (url)", "roots"} {
		mcp.AddTool(server, &mcp.Tool{Name: name}, noArgs)
	}
	return server
}

func TestGoSDKEverythingExample(t *testing.T) {
	ctx := t.Context()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := everythingServer().Connect(ctx, st, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "ringfence-test"}, nil).Connect(ctx, ct, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = cs.Close() })
	res, err := cs.ListTools(ctx, nil)
	require.NoError(t, err)

	var decls []mcpdecl.Declaration
	for _, tool := range res.Tools {
		d, err := mcpdecl.FromTool(tool)
		require.NoError(t, err)
		decls = append(decls, d)
	}
	rep := screen.Screen(decls, otherServers)
	require.Empty(t, rep.Listing)
	require.Len(t, rep.Tools, 10)
	for _, tool := range rep.Tools {
		if strings.ContainsAny(tool.Name, " ()") {
			// The example's display-style names break the MCP tool-name
			// rule; the go-sdk itself logs an error for them.
			require.Equal(t, []string{screen.CodeInvalidName}, codesOf(tool.Findings), "%s: %v", tool.Name, tool.Findings)
			require.True(t, tool.Refused)
			continue
		}
		require.Empty(t, tool.Findings, "%s: %v", tool.Name, tool.Findings)
		require.False(t, tool.Refused)
	}
}
