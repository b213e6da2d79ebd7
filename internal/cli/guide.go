package cli

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/ringfence/ringfence/internal/humanize"
	"github.com/ringfence/ringfence/internal/mcpserver"
)

// guide makes cobra's usage mistakes read like the rest of the CLI's errors: a mistyped
// command, flag or argument exits 2 (ExitUsage) with the closest valid spelling and where to
// look, instead of printing help with exit 0 or a bare "unknown flag".
func guide(root *cobra.Command) {
	root.SetFlagErrorFunc(flagError)
	root.SetHelpCommand(helpCommand(root))
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		// cobra's own default (2) applies only inside its legacy argument check.
		c.SuggestionsMinimumDistance = 2
		if c.HasSubCommands() {
			// A group (servers, audit, …) runs only to say which subcommand it lacks: cobra
			// would print its help and exit 0 for `servers lsit`.
			c.Args = unknownSubcommand
			if c.RunE == nil && c.Run == nil {
				c.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
			}
		} else if c.Args != nil {
			c.Args = explainArgs(c.Args)
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// helpCommand is `ringfence help [command]`: cobra's own prints the root's help and exits 0
// for a topic it does not know; this one refuses it like a mistyped command.
func helpCommand(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "Help about any command",
		RunE: func(_ *cobra.Command, args []string) error {
			cmd, rest, err := root.Find(args)
			if err != nil || cmd == nil {
				cmd, rest = root, args
			}
			if len(rest) > 0 {
				return unknownSubcommand(cmd, rest)
			}
			return cmd.Help()
		},
	}
}

// unknownSubcommand refuses a group's argument as a command it does not have, naming the
// closest one.
func unknownSubcommand(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf(": did you mean %q?", cmd.CommandPath()+" "+s[0])
	}
	return usagef("%s (%s --help lists its commands)", msg, cmd.CommandPath())
}

// explainArgs rewrites cobra's argument-count errors ("unknown command \"x\" for …" from
// NoArgs on a command that has no subcommands at all, "accepts 1 arg(s), received 0") into
// the command's usage line.
func explainArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			usage := cmd.CommandPath() + strings.TrimPrefix(cmd.Use, cmd.Name())
			if len(args) > 0 && strings.HasPrefix(err.Error(), "unknown command") {
				return usagef("%q takes no arguments, got %q: flags start with -- (usage: %s; %s --help)", cmd.CommandPath(), args[0], usage, cmd.CommandPath())
			}
			return usagef("%q %v (usage: %s; %s --help)", cmd.CommandPath(), err, usage, cmd.CommandPath())
		}
		return nil
	}
}

// flagError turns pflag's parse errors into usage errors, and names the closest flag for an
// unknown one.
func flagError(cmd *cobra.Command, err error) error {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "unknown flag: --"); ok {
		if s := closestFlag(cmd, name); s != "" {
			return usagef("unknown flag --%s for %q: did you mean --%s? (%s --help lists its flags)", name, cmd.CommandPath(), s, cmd.CommandPath())
		}
		return usagef("unknown flag --%s for %q (%s --help lists its flags)", name, cmd.CommandPath(), cmd.CommandPath())
	}
	return usagef("%s (%s --help lists its flags)", msg, cmd.CommandPath())
}

// closestFlag is the flag of cmd (its own or inherited) nearest to name: one it begins, or
// one at most two edits away.
func closestFlag(cmd *cobra.Command, name string) string {
	best, bestDist := "", 3
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		d := humanize.EditDistance(name, f.Name)
		if len(name) >= 3 && strings.HasPrefix(f.Name, name) {
			d = min(d, 1)
		}
		if d < bestDist {
			best, bestDist = f.Name, d
		}
	})
	return best
}

// addrSource says where --addr came from, for messages about it.
func (g *globals) addrSource(cmd *cobra.Command) string {
	switch {
	case cmd.Flags().Changed("addr"):
		return "--addr"
	case os.Getenv("RINGFENCE_ADDR") != "":
		return "RINGFENCE_ADDR"
	}
	return "the default"
}

// addrHost refuses an --addr that cannot name a gRPC server before anything is dialed (grpc-go
// would take "localhost" as localhost:443, and "http://host:port" as a host called "http"),
// and returns its host, or "" for a unix socket.
func addrHost(addr, from string) (string, error) {
	example := "e.g. --addr 127.0.0.1:50051 or RINGFENCE_ADDR=127.0.0.1:50051"
	// unix:path and unix:///path, unix-abstract:name: a socket, nothing to check here.
	if strings.HasPrefix(addr, "unix:") || strings.HasPrefix(addr, "unix-abstract:") {
		return "", nil
	}
	if rest, ok := strings.CutPrefix(addr, "dns:"); ok && !strings.HasPrefix(rest, "//") {
		addr = "dns:///" + rest
	}
	scheme, rest, hasScheme := strings.Cut(addr, "://")
	if hasScheme {
		switch scheme {
		case "dns", "passthrough":
			// dns:///host:port or dns://resolver/host:port.
			if i := strings.Index(rest, "/"); i >= 0 {
				rest = rest[i+1:]
			}
		case "http", "https", "grpc", "grpcs":
			hint := ""
			if scheme == "https" || scheme == "grpcs" {
				hint = "; for TLS pass --ca-file (RINGFENCE_CA_FILE)"
			}
			return "", usagef("%s %q is a URL, but the CLI takes the server's gRPC host:port: drop %q (--addr %s)%s", from, addr, scheme+"://", strings.TrimSuffix(rest, "/"), hint)
		default:
			return "", usagef("%s %q: unknown scheme %q: give host:port (%s), or a gRPC target dns:///host:port or unix:///path", from, addr, scheme, example)
		}
	}
	if !hasScheme {
		rest = addr
	}
	host, port, err := net.SplitHostPort(rest)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) && strings.Contains(ae.Err, "missing port") {
			return "", usagef("%s %q has no port: give host:port (%s): the server's gRPC address, RINGFENCE_GRPC_ADDR where it runs, not its REST one", from, addr, example)
		}
		return "", usagef("%s %q is not host:port (%s)", from, addr, example)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return "", usagef("%s %q: port %q is not a number from 1 to 65535 (%s)", from, addr, port, example)
	}
	return host, nil
}

// warnPlaintextKey warns when the API key is about to cross a network in clear: a plaintext
// connection (no --ca-file) to a host that is not loopback. A warning, not a refusal, since
// a private network may be trusted, but the user must know what travels how.
func warnPlaintextKey(w io.Writer, host string) {
	if host == "" || mcpserver.IsLoopback(host) {
		return
	}
	fmt.Fprintf(w, "warning: the API key goes to %s in plaintext: pass --ca-file (RINGFENCE_CA_FILE) so it travels over TLS\n", host)
}

// requiredFlags matches cobra's error for required flags left out.
var requiredFlags = regexp.MustCompile(`^required flag\(s\) (.+) not set$`)

// explainRequired turns cobra's `required flag(s) "name", "role" not set` into the flags to
// add and the command's usage line.
func explainRequired(cmd *cobra.Command, err error) error {
	if err == nil || cmd == nil {
		return err
	}
	m := requiredFlags.FindStringSubmatch(err.Error())
	if m == nil {
		return err
	}
	var flags []string
	for _, f := range strings.Split(m[1], ", ") {
		flags = append(flags, "--"+strings.Trim(f, `"`))
	}
	usage := cmd.CommandPath() + strings.TrimPrefix(cmd.Use, cmd.Name())
	list := flags[len(flags)-1]
	if len(flags) > 1 {
		list = strings.Join(flags[:len(flags)-1], ", ") + " and " + list
	}
	return usagef("%q needs %s (usage: %s; %s --help)", cmd.CommandPath(), list, usage, cmd.CommandPath())
}
