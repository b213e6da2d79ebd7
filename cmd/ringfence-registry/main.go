// Command ringfence-registry runs the registry service alone, for split deployments.
package main

import (
	"os"

	"github.com/ringfence/ringfence/internal/app"
)

func main() { os.Exit(app.Main("ringfence-registry", app.NewRegistry)) }
