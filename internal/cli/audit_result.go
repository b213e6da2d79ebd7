package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/mcpgate/mcpdecl/jcs"
)

// maxResultFile bounds the result check-result reads: above the largest result the pool
// hands a caller (RINGFENCE_POOL__MAX_RESULT_BYTES), with room for JSON's escapes.
const maxResultFile = 64 << 20

func newAuditCheckResultCmd(g *globals) *cobra.Command {
	var call, run, tenant string
	cmd := &cobra.Command{
		Use:   "check-result [FILE]",
		Short: "Tie a tool call's result to its audit record: exit 0 when the call's outcome record holds its digest",
		Long: `Tie a tool call's result, as a caller kept it, to the call's outcome record in the audit log.

FILE (standard input when omitted or -) holds the result as the caller received it, in any of
the forms Ringfence answers a call with: the JSON of "ringfence runs call -o json", a REST or
gRPC CallToolResponse (content, is_error, structured_content), or an MCP tools/call result
(content, isError, structuredContent), bare or inside its JSON-RPC response. The command
computes the result's digest as docs/api.md ("Result digests") defines it, looks up the call's
records (--call, or the call id the result names; for a call just answered it waits up to 3 s
for the outcome record to land), and exits 0 naming the outcome record that holds the same digest, or 1 saying what the records hold instead: a result that does not match
was changed after the pool returned it, or is another call's.`,
		Example: `  ringfence runs call --run r1 --agent a --tool docs__read -o json > result.json
  ringfence audit check-result result.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			in := cmd.InOrStdin()
			name := "standard input"
			if len(args) == 1 && args[0] != "-" {
				f, err := openInput(args[0])
				if err != nil {
					return err
				}
				defer f.Close()
				in, name = f, sprintLine("%q", args[0])
			}
			raw, err := io.ReadAll(io.LimitReader(in, maxResultFile+1))
			if err != nil {
				return usagef("cannot read %s: %v", name, err)
			}
			if len(raw) > maxResultFile {
				return usagef("%s is over %d MiB: no result the pool hands a caller is that large", name, maxResultFile>>20)
			}
			res, err := parseKeptResult(raw)
			if err != nil {
				return usagef("%s: %v", name, err)
			}
			if call == "" {
				call = res.callID
			}
			if call == "" {
				return usagef("%s names no call id: give --call CALL_ID (the call_id its caller was answered with)", name)
			}
			client, err := g.audit()
			if err != nil {
				return err
			}
			filter := &auditv1.Filter{CallId: call, RunId: run, Tenant: tenant, Kind: "tool_call"}
			var recs []*auditv1.Record
			// A call's outcome reaches the log a moment after its answer (docs/operations.md,
			// "The audit log"): a result checked right away waits that moment for it.
			for wait := outcomeWait; ; wait -= outcomePoll {
				recs, err = listAll(g, cmd.Context(), func(ctx context.Context, token string) ([]*auditv1.Record, string, error) {
					resp, err := client.List(ctx, &auditv1.ListRequest{Filter: filter, PageSize: listPageSize, PageToken: token})
					return resp.GetRecords(), resp.GetNextPageToken(), err
				})
				if err != nil {
					return err
				}
				if wait <= 0 || holdsDigest(recs) {
					break
				}
				select {
				case <-cmd.Context().Done():
					return cmd.Context().Err()
				case <-time.After(outcomePoll):
				}
			}
			return g.reportResultCheck(call, run, res, recs)
		},
	}
	cmd.Flags().StringVar(&call, "call", "", "the call's id (default: the call_id the result names)")
	cmd.Flags().StringVar(&run, "run", "", "only this run's records (call ids are the caller's choice and may repeat across runs)")
	cmd.Flags().StringVar(&tenant, "tenant", "", "only this tenant's records")
	return cmd
}

// How long check-result waits for a call's outcome record to land, and how often it looks.
const (
	outcomeWait = 3 * time.Second
	outcomePoll = 100 * time.Millisecond
)

// holdsDigest is whether any of the records holds a result digest.
func holdsDigest(recs []*auditv1.Record) bool {
	for _, r := range recs {
		if r.GetToolCall().GetResultDigest() != "" {
			return true
		}
	}
	return false
}

// keptResult is a tool call's result as its caller kept it: its digest and size, and the call
// id it names, if any.
type keptResult struct {
	digest string
	size   int64
	callID string
}

// parseKeptResult reads a result in any form Ringfence answers a call with (check-result's
// help) and computes its digest: the RFC 8785 form of {content, isError, structuredContent},
// structuredContent left out when absent or empty (docs/api.md, "Result digests").
func parseKeptResult(raw []byte) (keptResult, error) {
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(raw, &doc); err != nil {
		return keptResult{}, fmt.Errorf("is not a JSON object (%v): give the result as the call answered it", err)
	}
	if inner, ok := doc["result"]; ok && doc["jsonrpc"] != nil {
		// A JSON-RPC response: the result is inside.
		doc = nil
		if err := json.Unmarshal(inner, &doc); err != nil || doc == nil {
			return keptResult{}, errors.New("is a JSON-RPC response without a result object: it answered no tools/call")
		}
	}
	content, ok := doc["content"]
	if !ok {
		return keptResult{}, errors.New("has no content: give a tool call's result (runs call -o json, a CallToolResponse, or an MCP tools/call result)")
	}
	if isNull(content) {
		content = json.RawMessage("[]")
	}
	if t := bytes.TrimSpace(content); len(t) == 0 || t[0] != '[' {
		return keptResult{}, errors.New("content is not a list: give the result as the call answered it")
	}
	isError, err := firstBool(doc, "isError", "is_error")
	if err != nil {
		return keptResult{}, err
	}
	canonical := `{"content":` + string(content) + `,"isError":` + fmt.Sprint(isError)
	structured := firstOf(doc, "structuredContent", "structured_content")
	if t := bytes.TrimSpace(structured); len(t) > 0 && !isNull(t) {
		if t[0] != '{' {
			return keptResult{}, errors.New("structured content is not an object: give the result as the call answered it")
		}
		var members map[string]json.RawMessage
		if err := json.Unmarshal(t, &members); err != nil {
			return keptResult{}, fmt.Errorf("structured content: %v", err)
		}
		if len(members) > 0 {
			canonical += `,"structuredContent":` + string(t)
		}
	}
	b, err := jcs.Canonicalize([]byte(canonical + "}"))
	if err != nil {
		return keptResult{}, fmt.Errorf("has no canonical JSON form (%v): no result the pool hands a caller is like it", err)
	}
	sum := sha256.Sum256(b)
	out := keptResult{digest: "sha256:" + hex.EncodeToString(sum[:]), size: int64(len(b))}
	// The call id the answer names: a CallToolResponse's call_id, or the front door's
	// _meta["io.ringfence/call"].call_id, read from those members alone (a member of another
	// type names no call).
	_ = json.Unmarshal(doc["call_id"], &out.callID)
	if out.callID == "" {
		var meta struct {
			Call struct {
				CallID string `json:"call_id"`
			} `json:"io.ringfence/call"`
		}
		_ = json.Unmarshal(doc["_meta"], &meta)
		out.callID = meta.Call.CallID
	}
	return out, nil
}

func isNull(b []byte) bool { return string(bytes.TrimSpace(b)) == "null" }

// firstOf is the first of the members present (an MCP result's name or the API's).
func firstOf(doc map[string]json.RawMessage, names ...string) json.RawMessage {
	for _, n := range names {
		if v, ok := doc[n]; ok {
			return v
		}
	}
	return nil
}

func firstBool(doc map[string]json.RawMessage, names ...string) (bool, error) {
	v := firstOf(doc, names...)
	if v == nil || isNull(v) {
		return false, nil // a missing isError is false
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		return false, fmt.Errorf("%s is not true or false", names[0])
	}
	return b, nil
}

// reportResultCheck says whether one of the call's records holds the result's digest: exit 0
// naming it, or exit 1 saying what the records hold.
func (g *globals) reportResultCheck(call, run string, res keptResult, recs []*auditv1.Record) error {
	var match *auditv1.Record
	var others []string
	for _, r := range recs {
		tc := r.GetToolCall()
		switch {
		case tc.GetResultDigest() == "":
		case tc.GetResultDigest() == res.digest && tc.GetResultSize() == res.size:
			if match == nil {
				match = r
			}
		default:
			others = append(others, sprintLine("record %d holds %s (%d bytes)", r.GetSeq(), tc.GetResultDigest(), tc.GetResultSize()))
		}
	}
	if g.output == "json" {
		out := struct {
			Matches      bool   `json:"matches"`
			ResultDigest string `json:"result_digest"`
			ResultSize   int64  `json:"result_size"`
			CallID       string `json:"call_id"`
			RecordSeq    uint64 `json:"record_seq,omitempty"`
		}{match != nil, res.digest, res.size, call, match.GetSeq()}
		enc := json.NewEncoder(g.stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			return err
		}
	}
	where := sprintLine("call %s", call)
	if run != "" {
		where += sprintLine(" of run %s", run)
	}
	switch {
	case match != nil:
		if g.output != "json" {
			what, outcome := describeRecord(match)
			writef(g.stdout, "matches record %d: %s, %s\nresult %s, %d bytes\n", match.GetSeq(), what, outcome, res.digest, res.size)
		}
		return nil
	case len(recs) == 0:
		return &exitError{code: ExitFailure, msg: where + " has no records in the audit log: check the call id, --run and --tenant (and that this key may read that tenant)"}
	case len(others) == 0:
		return &exitError{code: ExitFailure, msg: sprintLine("no record of %s holds a result digest (%d records: the call returned no result, or its outcome is not in the log yet; records written before result digests were set have none)", where, len(recs))}
	default:
		return &exitError{code: ExitFailure, msg: sprintLine("does not match: this result is %s (%d bytes), but %s: the result was changed after the pool returned it, or it is another call's", res.digest, res.size, strings.Join(others, "; "))}
	}
}
