// Package version says which build of Ringfence a binary is: what an operator reads with
// --version before upgrading pool hosts together, and what a bug report should quote.
package version

import (
	"fmt"
	"runtime"
)

// revision is the commit the binary was built from, set by the Makefile
// (-ldflags "-X github.com/ringfence/ringfence/internal/version.revision=..."), with
// "+modified" when the tree had uncommitted changes. Go's own VCS stamping is off in
// workspace mode (go.work), so it cannot say this.
var revision string

// Revision is the commit the binary was built from, or "unknown" for a build without the
// Makefile's stamp.
func Revision() string {
	if revision == "" {
		return "unknown"
	}
	return revision
}

// String is binary's --version line.
func String(binary string) string {
	return fmt.Sprintf("%s commit %s (%s, %s/%s)", binary, Revision(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}
