// Command ringfence-pool runs the pool service alone, on a hardened host: the only process
// in a Ringfence deployment that starts MCP servers.
package main

import (
	"os"

	"github.com/ringfence/ringfence/internal/app"
)

func main() { os.Exit(app.Main("ringfence-pool", app.NewPool)) }
