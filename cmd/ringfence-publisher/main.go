// Command ringfence-publisher runs the publisher service alone, for split deployments.
package main

import (
	"os"

	"github.com/ringfence/ringfence/internal/app"
)

func main() { os.Exit(app.Main("ringfence-publisher", app.NewPublisher)) }
