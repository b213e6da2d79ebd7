package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	auditv1 "github.com/ringfence/ringfence/gen/go/ringfence/audit/v1"
	"github.com/ringfence/ringfence/internal/grpcserver"
)

type auditFilterFlags struct {
	tenant, run, server, tool, outcome, kind, call, since, until string
}

func (f *auditFilterFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.tenant, "tenant", "", "only this tenant")
	fl.StringVar(&f.run, "run", "", "only this run")
	fl.StringVar(&f.server, "server", "", "only this server ref")
	fl.StringVar(&f.tool, "tool", "", "only this tool name")
	fl.StringVar(&f.outcome, "outcome", "", "refused_before_dispatch or dispatched")
	fl.StringVar(&f.kind, "kind", "", "admin or tool_call")
	fl.StringVar(&f.call, "call", "", "only this call id's records (every attempt, and a retry that got its approved outcome)")
	fl.StringVar(&f.since, "since", "", "from this time (RFC 3339, or a duration ago such as 1h)")
	fl.StringVar(&f.until, "until", "", "before this time (RFC 3339, or a duration ago)")
}

func (f *auditFilterFlags) filter() (*auditv1.Filter, error) {
	out := &auditv1.Filter{Tenant: f.tenant, RunId: f.run, ServerRef: f.server, ToolName: f.tool, Outcome: f.outcome, Kind: f.kind, CallId: f.call}
	for name, raw := range map[string]string{"since": f.since, "until": f.until} {
		if raw == "" {
			continue
		}
		t, err := parseWhen(raw)
		if err != nil {
			return nil, usagef("--%s %q: use an RFC 3339 time (2026-11-30T12:00:00Z) or a duration ago (90m)", name, raw)
		}
		if name == "since" {
			out.Since = timestamppb.New(t)
		} else {
			out.Until = timestamppb.New(t)
		}
	}
	// Such a filter matches nothing, which would read as an empty log.
	if out.Since != nil && out.Until != nil && !out.Until.AsTime().After(out.Since.AsTime()) {
		return nil, usagef("--until %q is not after --since %q, so no record can match: a duration counts back from now (--since 2h --until 1h is the hour that ended an hour ago)", f.until, f.since)
	}
	return out, nil
}

func parseWhen(s string) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		return time.Now().Add(-d), nil
	}
	return time.Parse(time.RFC3339, s)
}

func newAuditCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "audit", Short: "Read, follow, verify and export the audit log (needs audit:read)"}

	var lf auditFilterFlags
	var limit int
	var pageToken string
	list := &cobra.Command{
		Use:   "list",
		Short: "List records, oldest first, --limit at a time; says how to read on when there are more",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := lf.filter()
			if err != nil {
				return err
			}
			client, err := g.audit()
			if err != nil {
				return err
			}
			if limit < 1 {
				return usagef("--limit must be at least 1, not %d", limit)
			}
			var recs []*auditv1.Record
			token := pageToken
			for len(recs) < limit {
				ctx, cancel := g.ctx(cmd.Context())
				resp, err := client.List(ctx, &auditv1.ListRequest{Filter: filter, PageSize: int32(min(1000, limit-len(recs))), PageToken: token})
				cancel()
				if err != nil {
					return err
				}
				recs = append(recs, resp.GetRecords()...)
				if token = resp.GetNextPageToken(); token == "" {
					break
				}
			}
			if g.output == "json" {
				if err := printJSON(g.stdout, &auditv1.ListResponse{Records: recs, NextPageToken: token}); err != nil {
					return err
				}
			} else {
				t := newTable(g.stdout, "SEQ", "TIME", "KIND", "TENANT", "WHAT", "OUTCOME")
				for _, r := range recs {
					what, outcome := describeRecord(r)
					t.row(fmt.Sprint(r.GetSeq()), r.GetTime().AsTime().Local().Format(time.DateTime), r.GetKind(), orDash(r.GetTenant()), what, outcome)
				}
				if err := t.flush(); err != nil {
					return err
				}
			}
			// On stderr, so a script reading stdout sees only records (and, as JSON, the
			// next_page_token itself).
			if token != "" {
				writef(g.stderr, "more records after these %d: the next page is --page-token %s (with the same filters), or raise --limit\n", len(recs), token)
			}
			return nil
		},
	}
	lf.register(list)
	list.Flags().IntVar(&limit, "limit", 100, "at most this many records")
	list.Flags().StringVar(&pageToken, "page-token", "", "start after the records an earlier list showed (the token it printed)")

	var tf auditFilterFlags
	var from uint64
	tail := &cobra.Command{
		Use:   "tail",
		Short: "Follow new records as they land (from --from SEQ to replay first); Ctrl-C stops",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			filter, err := tf.filter()
			if err != nil {
				return err
			}
			client, err := g.audit()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithCancel(g.streamCtx(cmd.Context()))
			defer cancel()
			stream, err := client.Watch(ctx, &auditv1.WatchRequest{FromSeq: from, Filter: filter})
			if err != nil {
				return err
			}
			// The server sends the watch's headers once it is admitted (authorized, its filter
			// accepted; grpcserver.AdmitStream): wait for them, so a refusal prints only the
			// refusal, not a line saying the log is followed first. Headers that do not say
			// so are a refusal's, or a server's that sends them with its first record: Recv
			// says which.
			var first *auditv1.WatchResponse
			md, err := stream.Header()
			if err == nil && !grpcserver.Admitted(md) {
				first, err = stream.Recv()
			}
			if errors.Is(err, io.EOF) || errors.Is(ctx.Err(), context.Canceled) {
				return nil
			}
			if err != nil {
				return err
			}
			// A quiet log looks like a hung command: say what the wait is for.
			if from == 0 {
				fmt.Fprintln(g.stderr, "following the audit log: new records print as they land (--from 1 replays from the first); Ctrl-C stops")
			} else {
				writef(g.stderr, "following the audit log from record %d; Ctrl-C stops\n", from)
			}
			if g.output != "json" {
				fmt.Fprintln(g.stdout, "SEQ TIME KIND TENANT WHAT OUTCOME")
			}
			if first != nil {
				if err := g.printRecordLine(first.GetRecord()); err != nil {
					return err
				}
			}
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) || errors.Is(ctx.Err(), context.Canceled) {
					return nil
				}
				if err != nil {
					return err
				}
				if err := g.printRecordLine(resp.GetRecord()); err != nil {
					return err
				}
			}
		},
	}
	tf.register(tail)
	tail.Flags().Uint64Var(&from, "from", 0, "replay from this sequence number first (0: only new records)")

	var anchor string
	verify := &cobra.Command{
		Use:   "verify",
		Short: "Recompute the hash chain; exit 1 naming the first broken record",
		Long: `Recompute the hash chain; exit 1 naming the first broken record.

The chain proves the log was not edited in place. Keep the head it prints somewhere else, and
pass it back later with --anchor SEQ:HASH: the chain must still pass through it, which also
catches records cut from the end with the head rewritten to match, or a rewritten log.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			client, err := g.audit()
			if err != nil {
				return err
			}
			ctx, cancel := g.ctx(cmd.Context())
			defer cancel()
			req := &auditv1.VerifyRequest{}
			if anchor != "" {
				seq, hash, ok := strings.Cut(anchor, ":")
				n, perr := strconv.ParseUint(seq, 10, 64)
				if !ok || perr != nil {
					return usagef("--anchor must be SEQ:HASH, as an earlier verify printed it (head 9 f857…: --anchor 9:f857…)")
				}
				req.AnchorSeq, req.AnchorHash = n, hash
			}
			resp, err := client.Verify(ctx, req)
			if err != nil {
				return err
			}
			if g.output == "json" {
				if err := printJSON(g.stdout, resp); err != nil {
					return err
				}
			}
			if !resp.GetOk() {
				return &exitError{code: ExitFailure, msg: sprintLine("audit log broken at record %d: %s (checked %d records)", resp.GetFirstBroken(), resp.GetReason(), resp.GetChecked())}
			}
			if g.output != "json" {
				writef(g.stdout, "ok: %d records verified; head %d %s\n", resp.GetChecked(), resp.GetHeadSeq(), resp.GetHeadHash())
			}
			return nil
		},
	}

	verify.Flags().StringVar(&anchor, "anchor", "", "a head kept from an earlier verify, SEQ:HASH: the chain must still pass through it")

	var ef auditFilterFlags
	var outFile string
	var force bool
	export := &cobra.Command{
		Use:   "export [--out FILE [--force]]",
		Short: "Write every matching record as JSON lines (--out refuses to replace a file without --force)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			filter, err := ef.filter()
			if err != nil {
				return err
			}
			if outFile != "" && !force {
				if _, err := os.Lstat(outFile); err == nil {
					return usagef("%s already exists: pass --force to replace it, or choose another --out", outFile)
				}
			}
			client, err := g.audit()
			if err != nil {
				return err
			}
			w := g.stdout
			if outFile != "" {
				// Written beside the target and moved into place once complete, so a failed
				// export leaves an existing file as it was.
				out, err := newExportFile(outFile, force)
				if err != nil {
					return err
				}
				defer func() { err = out.finish(err) }()
				w = out.f
			}
			stream, err := client.Export(g.streamCtx(cmd.Context()), &auditv1.ExportRequest{Filter: filter})
			if err != nil {
				return err
			}
			n := 0
			for {
				resp, err := stream.Recv()
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					return err
				}
				b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(resp.GetRecord())
				if err != nil {
					return err
				}
				if _, err := fmt.Fprintln(w, string(b)); err != nil {
					return err
				}
				n++
			}
			if outFile != "" {
				writef(g.stderr, "exported %d records to %s\n", n, outFile)
			}
			return nil
		},
	}
	ef.register(export)
	export.Flags().StringVar(&outFile, "out", "", "write to this file (mode 0600) instead of stdout")
	export.Flags().BoolVar(&force, "force", false, "with --out, replace an existing file")

	cmd.AddCommand(list, tail, verify, export, newAuditCheckResultCmd(g))
	return cmd
}

// exportFile is an export on its way to its file: a temporary file in the same directory,
// renamed over the target (or, without force, linked to it, which fails if it appeared
// meanwhile) only when the export completed.
type exportFile struct {
	f      *os.File
	target string
	force  bool
}

// A directory that does not exist or cannot be written to is a mistake in --out: said with
// --out's own path, not the temporary file's.
func newExportFile(target string, force bool) (*exportFile, error) {
	dir := filepath.Dir(target)
	f, err := os.CreateTemp(dir, "."+filepath.Base(target)+".*.partial")
	if err != nil {
		return nil, usagef("--out %s: cannot create a file in %s (%v): choose a directory that exists and that you can write to", sprintLine("%q", target), sprintLine("%q", dir), pathErr(err))
	}
	return &exportFile{f: f, target: target, force: force}, nil
}

// openInput opens a file the command line names for reading; a path that is missing,
// unreadable or a directory is a mistake on the command line, said with the path as given.
func openInput(name string) (*os.File, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, usagef("cannot read %s: %v", sprintLine("%q", name), pathErr(err))
	}
	if info, err := f.Stat(); err == nil && info.IsDir() {
		f.Close()
		return nil, usagef("cannot read %s: it is a directory: give a file", sprintLine("%q", name))
	}
	return f, nil
}

// pathErr is err without the path an *os.PathError repeats, for messages that name the path
// themselves.
func pathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// finish moves the export into place when err is nil, and removes it otherwise.
func (e *exportFile) finish(err error) error {
	tmp := e.f.Name()
	defer os.Remove(tmp) // after a link, the target keeps the data
	if err == nil {
		err = e.f.Sync()
	}
	if cerr := e.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if e.force {
		return os.Rename(tmp, e.target)
	}
	if err := os.Link(tmp, e.target); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return usagef("%s appeared during the export: pass --force to replace it, or choose another --out", e.target)
		}
		return err
	}
	return nil
}

func (g *globals) audit() (auditv1.AuditServiceClient, error) {
	conn, err := g.dial()
	if err != nil {
		return nil, err
	}
	return auditv1.NewAuditServiceClient(conn), nil
}

func (g *globals) printRecordLine(r *auditv1.Record) error {
	if g.output == "json" {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(r)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(g.stdout, string(b))
		return err
	}
	what, outcome := describeRecord(r)
	_, err := linef(g.stdout, "%d %s %s %s %s %s\n", r.GetSeq(), r.GetTime().AsTime().Local().Format(time.DateTime), r.GetKind(), orDash(r.GetTenant()), what, outcome)
	return err
}

// describeRecord gives a record's one-line summary: what happened, and its outcome.
func describeRecord(r *auditv1.Record) (string, string) {
	if a := r.GetAdmin(); a != nil {
		return sprintLine("%s %s %s by %s", a.GetAction(), a.GetResourceType(), a.GetResourceId(), adminActor(a)), "-"
	}
	t := r.GetToolCall()
	// A call refused before its binding resolved (an unknown run, agent or tool) names no
	// server; the tool is then the binding name the agent asked for.
	target := t.GetToolName()
	if t.GetServerRef() != "" {
		target = t.GetServerRef() + "/" + target
	}
	what := sprintLine("run %s %s→%s call %s#%d", t.GetRunId(), t.GetAgentNode(), target, t.GetCallId(), t.GetAttempt())
	outcome := t.GetOutcome()
	switch {
	case t.GetReason() != "":
		outcome += ": " + t.GetReason()
	case t.GetResult() != "":
		outcome += ": " + t.GetResult()
		if t.GetFailureClass() != "" {
			outcome += " (" + t.GetFailureClass() + ")"
		}
	}
	if len(t.GetAdvisory()) > 0 {
		outcome += " [advisory: " + strings.Join(t.GetAdvisory(), "; ") + "]"
	}
	if a := t.GetApproval(); a != nil {
		outcome += " [approval " + a.GetApprovalId() + " " + a.GetState()
		switch {
		case a.GetDecidedBy() == "":
		case a.GetState() == "delivered":
			// The retry that got the approved outcome: whoever made it, the approver decided.
			outcome += ", approved by " + a.GetDecidedBy()
		default:
			outcome += " by " + a.GetDecidedBy()
		}
		if c := a.GetDispatchedCallId(); c != "" {
			// The retry names the call the approver dispatched, as its own records list it.
			outcome += sprintLine(", dispatched as call %s#%d", c, a.GetDispatchedAttempt())
		}
		outcome += "]"
	}
	if len(t.GetLoadedTools()) > 0 {
		outcome += " [loaded: " + strings.Join(t.GetLoadedTools(), ", ") + "]"
	}
	return what, outcome
}

// adminActor says who made an admin change as auth.Principal.Actor does: what the key is and
// its id, "key:ops (operator, key_0a1b…)". Records written before keys' names were recorded
// show the id and the role.
func adminActor(a *auditv1.AdminEvent) string {
	switch {
	case a.GetActorKeyName() != "":
		return fmt.Sprintf("key:%s (%s, %s)", a.GetActorKeyName(), a.GetActorRole(), a.GetActorKeyId())
	case strings.HasPrefix(a.GetActorKeyId(), "key_"):
		return fmt.Sprintf("key:%s (%s)", a.GetActorKeyId(), a.GetActorRole())
	}
	return a.GetActorKeyId() // service:<name>, system
}
