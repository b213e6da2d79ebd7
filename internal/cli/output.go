package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

var jsonOut = protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}

// printJSON writes a message as the same JSON the REST API returns, indented. protojson's own
// whitespace is deliberately unstable, so it is normalized here for scripts that diff output.
func printJSON(w io.Writer, m proto.Message) error {
	b, err := jsonOut.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

// printFields writes a flat JSON object of strings, keys in the order given.
func printFields(w io.Writer, pairs ...string) error {
	var b bytes.Buffer
	b.WriteByte('{')
	for i := 0; i+1 < len(pairs); i += 2 {
		if i > 0 {
			b.WriteString(", ")
		}
		k, _ := json.Marshal(pairs[i])
		v, _ := json.Marshal(pairs[i+1])
		fmt.Fprintf(&b, "%s: %s", k, v)
	}
	b.WriteString("}\n")
	_, err := w.Write(b.Bytes())
	return err
}

// table writes aligned columns.
type table struct {
	tw *tabwriter.Writer
}

func newTable(w io.Writer, headers ...string) *table {
	t := &table{tw: tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)}
	t.row(headers...)
	return t
}

func (t *table) row(cols ...string) {
	for i, c := range cols {
		cols[i] = oneLine(strings.ReplaceAll(strings.ReplaceAll(c, "\t", " "), "\n", " "))
	}
	fmt.Fprintln(t.tw, strings.Join(cols, "\t"))
}

func (t *table) flush() error { return t.tw.Flush() }

// kv writes "key: value" lines aligned; a value never breaks its line.
func kv(w io.Writer, pairs ...string) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	for i := 0; i+1 < len(pairs); i += 2 {
		fmt.Fprintf(tw, "%s:\t%s\n", pairs[i], oneLine(pairs[i+1]))
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func truncate(s string, n int) string {
	s = strings.TrimSpace(s)
	if len([]rune(s)) <= n {
		return s
	}
	return string([]rune(s)[:n-1]) + "…"
}
