package grpcserver

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	poolv1 "github.com/ringfence/ringfence/gen/go/ringfence/pool/v1"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
	"github.com/ringfence/ringfence/mcpgate/sanitize"
	"github.com/ringfence/ringfence/mcpgate/schemas"
	"github.com/ringfence/ringfence/mcpgate/screen"
)

// arrays and objects nest n levels of arrays or of objects, with a scalar inside.
func arrays(n int) string  { return strings.Repeat("[", n) + "1" + strings.Repeat("]", n) }
func objects(n int) string { return strings.Repeat(`{"a":`, n) + "1" + strings.Repeat("}", n) }

// TestEveryDepthCheckSaysTheSame: the REST gateway, the pool's argument check (schemas), its
// result check (sanitize), and the declaration screen (jcs, screen) each accept exactly their
// limit of levels and refuse one more, arrays and objects alike (the value itself is the
// first level), with one wording: "nested too deeply: more than N levels of arrays and objects".
func TestEveryDepthCheckSaysTheSame(t *testing.T) {
	decode := func(v string) (any, error) {
		var out any
		d := json.NewDecoder(strings.NewReader(v))
		d.UseNumber()
		return out, d.Decode(&out)
	}
	anySchema, err := schemas.Compile(json.RawMessage(`{}`))
	require.NoError(t, err)
	checks := []struct {
		name  string
		limit int
		check func(v string) error
	}{
		// The body is level 1 and arguments level 2.
		{"REST body", maxMessageNesting, func(v string) error {
			return newJSONMarshaler().NewDecoder(strings.NewReader(`{"run_id":"r","arguments":{"a":` + v + `}}`)).Decode(&poolv1.CallToolRequest{})
		}},
		{"arguments (schemas)", schemas.MaxDepth, func(v string) error {
			val, err := decode(v)
			require.NoError(t, err)
			return anySchema.Validate(val)
		}},
		{"results (sanitize)", sanitize.MaxDepth, func(v string) error {
			val, err := decode(v)
			require.NoError(t, err)
			_, err = sanitize.ValueWithin(val, sanitize.Options{})
			return err
		}},
		{"pins (jcs)", jcs.MaxDepth, func(v string) error {
			_, err := jcs.Canonicalize([]byte(v))
			return err
		}},
		{"declarations (screen)", screen.MaxSchemaDepth, func(v string) error {
			r := screen.ScreenTool(mcpdecl.Declaration{Name: "t", InputSchema: json.RawMessage(`{"type":"object","enum":[` + v + `]}`)}, screen.Context{})
			for _, f := range r.Findings {
				if f.Code == screen.CodeSchemaTooDeep {
					return fmt.Errorf("%s", f.Message)
				}
			}
			return nil
		}},
	}
	for _, c := range checks {
		// The REST body and the screened schema wrap the value in levels of their own.
		wrap := map[string]int{"REST body": 2, "declarations (screen)": 2}[c.name]
		for kind, nest := range map[string]func(int) string{"arrays": arrays, "objects": objects} {
			t.Run(c.name+"/"+kind, func(t *testing.T) {
				require.NoError(t, c.check(nest(c.limit-wrap)), "exactly %d levels pass", c.limit)
				err := c.check(nest(c.limit - wrap + 1))
				require.ErrorContains(t, err, fmt.Sprintf("nested too deeply: more than %d levels of arrays and objects", c.limit))
			})
		}
	}
}
