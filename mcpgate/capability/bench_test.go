package capability

import (
	"fmt"
	"strings"
	"testing"
)

// pathological returns the revoke entries and the requirement of the reported CPU exhaustion:
// 256 revoke entries (4 policies × 64) of near-maximal glob scopes against one requirement of
// the same shape, as a node's binding or a call's expanded {path} argument is compared.
// shape "repro" is the report's (their literal tails differ, "X…" against "Y…"); "open" ends
// both in wildcards, so no literal end decides the comparison early.
func pathological(shape string) (Effective, Capability) {
	var revoked []string
	var required string
	switch shape {
	case "repro":
		for i := range 256 {
			revoked = append(revoked, fmt.Sprintf("fs.read:/%sX%02d", strings.Repeat("a*", 120), i%100))
		}
		required = "fs.read:/" + strings.Repeat("a*", 120) + "Y07"
	case "open":
		// One more "/" than the requirement: "*" never crosses it, so no revoke entry overlaps and
		// each is compared to the end.
		for range 256 {
			revoked = append(revoked, "fs.read:"+strings.Repeat("*/", 123)+"*")
		}
		required = "fs.read:" + strings.Repeat("*/", 122) + "*"
	}
	return Effective{Held: MustParseSet([]string{"fs.read"}), Revoked: MustParseSet(revoked)}, MustParseSet([]string{required})[0]
}

// BenchmarkRevokedByPathological is the work of one requirement against 256 near-maximal glob
// revoke entries: what the agent floor does per node capability and the pool per call.
func BenchmarkRevokedByPathological(b *testing.B) {
	for _, shape := range []string{"repro", "open"} {
		b.Run(shape, func(b *testing.B) {
			eff, req := pathological(shape)
			if got := eff.RevokedBy(req); len(got) != 0 {
				b.Fatalf("%d revoke entries take the requirement away; want none", len(got))
			}
			b.ReportAllocs()
			for b.Loop() {
				eff.RevokedBy(req)
			}
		})
	}
}

// BenchmarkParse: a node's bindings as every call's ceiling and floor checks parse them.
func BenchmarkParse(b *testing.B) {
	ss := []string{"process_spawn", "external_api_call", "docs.read:{path}"}
	b.ReportAllocs()
	for b.Loop() {
		for _, s := range ss {
			if _, err := Parse(s); err != nil {
				b.Fatal(err)
			}
		}
	}
}
