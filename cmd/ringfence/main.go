// Command ringfence is the Ringfence CLI.
package main

import (
	"os"

	"github.com/ringfence/ringfence/internal/cli"
)

func main() { os.Exit(cli.Execute(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
