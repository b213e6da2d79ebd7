package mcpgate

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// Conn is an open session that can be closed.
type Conn interface {
	Session
	Close() error
}

// Server opens sessions to one MCP server. Command and StreamableHTTP are the usual kinds;
// ServerFunc makes one of any function (an in-process server, say).
type Server interface {
	Open(ctx context.Context) (Conn, error)
}

// Command is a stdio MCP server: a program started for each session.
type Command struct {
	Path string
	Args []string
	// Env is the program's whole environment. Nil gives it PATH alone, so no secret of the
	// embedding service reaches a server unless it is named here.
	Env []string
	// Dir is its working directory ("" is the caller's).
	Dir string
}

// Open starts the program and connects over its stdio.
func (c Command) Open(ctx context.Context) (Conn, error) {
	if c.Path == "" {
		return nil, errors.New("mcpgate: the Command has no Path: name the MCP server's program")
	}
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env, cmd.Dir = c.Env, c.Dir
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	}
	return OpenCommand(ctx, cmd)
}

// StreamableHTTP is a remote MCP server at a streamable HTTP endpoint.
type StreamableHTTP struct {
	URL string
	// Client carries credentials; nil is http.DefaultClient.
	Client *http.Client
}

// Open connects to the endpoint.
func (s StreamableHTTP) Open(ctx context.Context) (Conn, error) {
	return OpenStreamableHTTP(ctx, s.URL, s.Client)
}

// ServerFunc is a Server made of a function.
type ServerFunc func(ctx context.Context) (Conn, error)

// Open calls f.
func (f ServerFunc) Open(ctx context.Context) (Conn, error) { return f(ctx) }

// AdapterSpec is one MCP server a program binds at start-up.
type AdapterSpec struct {
	// Name identifies the adapter: 1 to 64 of a-z, 0-9, '_' and '-'.
	Name   string
	Server Server
	// RequiredCapabilities are what every call of the server's tools needs, e.g.
	// "fs.read:/tmp/sandbox/*".
	RequiredCapabilities []string
	// Permissions adds per-tool requirements (see BindOptions.Permissions). With no
	// RequiredCapabilities, a tool not named here is refused every call (default-deny); an
	// empty list says the tool needs none.
	Permissions map[string][]string
}

var adapterName = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)

// Registry collects AdapterSpecs from the packages that provide them. Most programs use the
// package's own, through RegisterAdapter and CollectAdapters.
type Registry struct {
	mu    sync.Mutex
	specs []AdapterSpec
}

// Register adds specs; a package calls it from an init function. Nothing is checked until
// Collect, which reports every problem at start-up.
func (r *Registry) Register(specs ...AdapterSpec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.specs = append(r.specs, specs...)
}

// Collect returns every registered spec and extra (e.g. adapters the program's configuration
// names), sorted by name. It refuses a name that is malformed or taken twice, a spec without
// a server, and a requirement that is not a capability (in RequiredCapabilities or
// Permissions).
func (r *Registry) Collect(extra ...AdapterSpec) ([]AdapterSpec, error) {
	r.mu.Lock()
	all := append(slices.Clone(r.specs), extra...)
	r.mu.Unlock()
	slices.SortStableFunc(all, func(a, b AdapterSpec) int { return cmp.Compare(a.Name, b.Name) })
	var errs []error
	for i, s := range all {
		switch {
		case !adapterName.MatchString(s.Name):
			errs = append(errs, fmt.Errorf("mcpgate: adapter name %q must match %s", truncate(s.Name, 80), adapterName))
		case i > 0 && all[i-1].Name == s.Name:
			errs = append(errs, fmt.Errorf("mcpgate: adapter %q is registered twice: rename one", s.Name))
		case s.Server == nil:
			errs = append(errs, fmt.Errorf("mcpgate: adapter %q has no Server", s.Name))
		}
		if err := checkPermissions("Required", s.RequiredCapabilities); err != nil {
			errs = append(errs, fmt.Errorf("adapter %q: %w", s.Name, err))
		}
		for _, tool := range slices.Sorted(maps.Keys(s.Permissions)) {
			if err := checkPermissions(fmt.Sprintf("Permissions[%q]", tool), s.Permissions[tool]); err != nil {
				errs = append(errs, fmt.Errorf("adapter %q: %w", s.Name, err))
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return all, nil
}

var defaultRegistry Registry

// RegisterAdapter adds specs to the package's registry, from an init function: the Go
// counterpart of a plugin's entry point.
func RegisterAdapter(specs ...AdapterSpec) { defaultRegistry.Register(specs...) }

// CollectAdapters returns every adapter RegisterAdapter added and extra, checked and sorted
// by name (see Registry.Collect).
func CollectAdapters(extra ...AdapterSpec) ([]AdapterSpec, error) {
	return defaultRegistry.Collect(extra...)
}

// ErrUnknownTool: a Host call names an adapter or tool it did not bind.
var ErrUnknownTool = errors.New("mcpgate: no such bound tool")

// ErrNotStarted: a Host call before Start, or after Close.
var ErrNotStarted = errors.New("mcpgate: the host is not started")

// Host binds adapters when it starts, gates every call to their tools, and closes their
// sessions when it stops.
type Host struct {
	adapters []AdapterSpec

	mu    sync.RWMutex
	bound map[string]*bound
}

type bound struct {
	conn  Conn
	tools []ToolSpec
}

// NewHost returns a Host for adapters (e.g. what CollectAdapters returned).
func NewHost(adapters ...AdapterSpec) *Host {
	return &Host{adapters: slices.Clone(adapters)}
}

// Start opens a session to every adapter's server and binds its tools, in order. When one
// fails, the sessions opened so far are closed and the error names the adapter and wraps its
// cause (errors.As finds a *ValidationError from Bind). A second Start is an error.
func (h *Host) Start(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.bound != nil {
		return errors.New("mcpgate: the host is started already")
	}
	all := make(map[string]*bound, len(h.adapters))
	fail := func(name string, err error) error {
		for _, b := range all {
			_ = b.conn.Close()
		}
		return fmt.Errorf("mcpgate: adapter %q: %w", name, err)
	}
	for _, a := range h.adapters {
		if _, dup := all[a.Name]; dup {
			return fail(a.Name, errors.New("bound twice"))
		}
		if a.Server == nil {
			return fail(a.Name, errors.New("has no Server: set AdapterSpec.Server (CollectAdapters checks every spec)"))
		}
		conn, err := a.Server.Open(ctx)
		if err != nil {
			return fail(a.Name, err)
		}
		all[a.Name] = &bound{conn: conn}
		tools, err := Bind(ctx, conn, BindOptions{Required: a.RequiredCapabilities, Permissions: a.Permissions})
		if err != nil {
			return fail(a.Name, err)
		}
		all[a.Name].tools = tools
	}
	h.bound = all
	return nil
}

// Adapters returns the names of the bound adapters, sorted.
func (h *Host) Adapters() []string {
	h.mu.RLock()
	defer h.mu.RUnlock()
	names := make([]string, 0, len(h.bound))
	for name := range h.bound {
		names = append(names, name)
	}
	slices.Sort(names)
	return names
}

// Tools returns copies of the tools bound for adapter: changing them (their Permissions, their
// schemas) changes nothing the host gates calls with.
func (h *Host) Tools(adapter string) []ToolSpec {
	h.mu.RLock()
	defer h.mu.RUnlock()
	b, ok := h.bound[adapter]
	if !ok {
		return nil
	}
	out := make([]ToolSpec, len(b.tools))
	for i, t := range b.tools {
		t.InputSchema, t.OutputSchema = bytes.Clone(t.InputSchema), bytes.Clone(t.OutputSchema)
		t.Permissions, t.Findings = slices.Clone(t.Permissions), slices.Clone(t.Findings)
		if t.Annotations != nil {
			a := *t.Annotations
			t.Annotations = &a
		}
		out[i] = t
	}
	return out
}

// CallTool calls tool of adapter through every gate (see CallTool, whose errors it returns).
// Before Start or after Close it returns ErrNotStarted; for an adapter or tool the host did
// not bind, an error that wraps ErrUnknownTool and lists what it did bind.
func (h *Host) CallTool(ctx context.Context, adapter, tool string, args map[string]any, caps Capabilities, opts ...CallOption) (*Result, error) {
	h.mu.RLock()
	started := h.bound != nil
	b, ok := h.bound[adapter]
	h.mu.RUnlock()
	if !started {
		return nil, ErrNotStarted
	}
	if !ok {
		return nil, fmt.Errorf("%w: no adapter %q (bound: %s)", ErrUnknownTool, truncate(adapter, 80), strings.Join(h.Adapters(), ", "))
	}
	i := slices.IndexFunc(b.tools, func(t ToolSpec) bool { return t.Name == tool })
	if i < 0 {
		names := make([]string, len(b.tools))
		for j, t := range b.tools {
			names[j] = t.Name
		}
		return nil, fmt.Errorf("%w: adapter %q binds no tool %q (it binds: %s)", ErrUnknownTool, adapter, truncate(tool, 80), safeText(strings.Join(names, ", ")))
	}
	return CallTool(ctx, b.conn, &b.tools[i], args, caps, opts...)
}

// Close closes every adapter's session; calls are refused from then on.
func (h *Host) Close() error {
	h.mu.Lock()
	all := h.bound
	h.bound = nil
	h.mu.Unlock()
	var errs []error
	for name, b := range all {
		if err := b.conn.Close(); err != nil {
			errs = append(errs, fmt.Errorf("mcpgate: close adapter %q: %w", name, err))
		}
	}
	return errors.Join(errs...)
}
