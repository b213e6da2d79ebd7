// Command ringfence-audit runs the audit service alone, for split deployments.
package main

import (
	"os"

	"github.com/ringfence/ringfence/internal/app"
)

func main() { os.Exit(app.Main("ringfence-audit", app.NewAudit)) }
