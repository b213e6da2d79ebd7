// Command ringfenced runs every Ringfence service in one process: the embedded default, with
// bbolt files in one data directory and no other server needed except a Docker engine.
package main

import (
	"os"

	"github.com/ringfence/ringfence/internal/app"
)

func main() { os.Exit(app.Main("ringfenced", app.NewAllInOne)) }
