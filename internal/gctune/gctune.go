// Package gctune holds the Go garbage collector setting every Ringfence server runs with.
//
// The services keep small live heaps (registrations, keys, runs: megabytes) and allocate
// fast per request (gRPC framing and protobuf messages). With Go's default GOGC=100 such a
// process collects many times a second, and the collector took about a third of the CPU of
// an authenticated GetServer under load (see docs/benchmarks.md). GOGC=200 bought the
// registry 20-40% more requests per second; the pool, whose per-call allocation is higher
// (go-sdk decodes every message with a fresh 32 KB buffer), gained another ~20% in calls per
// second at 400, which the registry neither gained nor lost. A heap target of five times the
// live heap costs tens of megabytes at most here. An operator who sets GOGC (or GOMEMLIMIT to
// cap memory) keeps the last word.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC value servers use when the environment does not set GOGC.
const Percent = 400

// Apply sets the collector to Percent unless GOGC is set in the environment, and returns the
// previous setting and whether it changed anything.
func Apply() (previous int, applied bool) {
	if _, set := os.LookupEnv("GOGC"); set {
		return 0, false
	}
	return debug.SetGCPercent(Percent), true
}
