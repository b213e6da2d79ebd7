// Package gctune holds the Go garbage collector setting every Ringfence server runs with.
//
// The services keep small live heaps (registrations, keys, runs: megabytes) and allocate
// fast per request (gRPC framing and protobuf messages). With Go's default GOGC=100 such a
// process collects many times a second, and the collector took about a third of the CPU of
// an authenticated GetServer under load (see docs/benchmarks.md). Doubling the heap target
// costs a few megabytes here and bought 20-40% more requests per second. An operator who sets
// GOGC (or GOMEMLIMIT to cap memory) keeps the last word.
package gctune

import (
	"os"
	"runtime/debug"
)

// Percent is the GOGC value servers use when the environment does not set GOGC.
const Percent = 200

// Apply sets the collector to Percent unless GOGC is set in the environment, and returns the
// previous setting and whether it changed anything.
func Apply() (previous int, applied bool) {
	if _, set := os.LookupEnv("GOGC"); set {
		return 0, false
	}
	return debug.SetGCPercent(Percent), true
}
