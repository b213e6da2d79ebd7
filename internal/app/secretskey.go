package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ringfence/ringfence/internal/config"
	"github.com/ringfence/ringfence/internal/secretbox"
)

// secretsKeyFile is the key file cfg names: secrets_key_file, default <data_dir>/secrets.key.
func secretsKeyFile(cfg *config.Config) string {
	if cfg.SecretsKeyFile != "" {
		return cfg.SecretsKeyFile
	}
	return filepath.Join(cfg.DataDir, "secrets.key")
}

const secretsKeyUsage = `Usage: %[1]s secrets-key rotate [--file FILE | the server's own flags]

Puts a new key at the head of the secrets key file, keeping the old keys after it: the new
key seals from the next start, which re-seals every stored value under it; the old keys still
open what they sealed. Once the log says "every sealed value opens with the first key", remove
the other lines (docs/operations.md, "Rotating the secrets key"). The key file is FILE, or the
one the server's configuration names (secrets_key_file, default <data_dir>/secrets.key, from
the same flags, environment and --config the server starts with). No key is printed.
`

// secretsKeyCommand is "<name> secrets-key ...": a command on the server's own key file, run
// on its host, not a call to a running server. It returns the exit status.
func secretsKeyCommand(name string, args, environ []string, stdout, stderr io.Writer) int {
	if !sealsWithTheSecretsKey(name) {
		// A rotation here would find no key file (none is ever made for this binary) and
		// send its user looking for one.
		fmt.Fprintf(stderr, "%s secrets-key: %s keeps no secrets key: only the registry and the pool seal with one (ringfenced, ringfence-registry, ringfence-pool); run `secrets-key rotate` with those, on their hosts\n", name, name)
		return 2
	}
	if len(args) == 0 || args[0] != "rotate" {
		fmt.Fprintf(stderr, secretsKeyUsage, name)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return 0
		}
		return 2
	}
	file, rest, err := fileFlag(args[1:])
	if err != nil {
		fmt.Fprintf(stderr, "%s secrets-key rotate: %v\n", name, err)
		return 2
	}
	dataDir := ""
	if file == "" {
		// Only where the key file is: the server's other settings (its TLS files, its peers)
		// need not be given to rotate it.
		cfg, err := config.LoadSettings(name, rest, environ, stderr)
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		if err != nil {
			fmt.Fprintf(stderr, "%s secrets-key rotate: %v (or name the key file with --file)\n", name, err)
			return 2
		}
		if cfg.SecretsKeyFile == "" && cfg.DataDir == "" {
			fmt.Fprintf(stderr, "%s secrets-key rotate: data_dir is empty and secrets_key_file unset: name the data_dir the server runs on (--data-dir), or the key file (--file)\n", name)
			return 2
		}
		file = secretsKeyFile(cfg)
		dataDir = cfg.DataDir
	}
	target, _ := secretbox.Target(file)
	n, err := secretbox.Rotate(file)
	if err != nil {
		fmt.Fprintf(stderr, "%s secrets-key rotate: %v\n", name, err)
		return 1
	}
	if target != "" && target != file {
		// The link stays: the file it points at is the one rotated.
		file = target + " (where the link " + file + " points)"
	}
	start := "Start the server: it re-seals the stored secrets under the new key. "
	if held := heldDataFile(dataDir); held != "" {
		// The server reads the key file only at start: until it starts again it seals with
		// the old key, and the log line the next step waits for never comes.
		start = fmt.Sprintf("A server is running on %s (it holds %s open): it goes on sealing with the old key until it starts again. "+
			"Restart it: that start re-seals the stored secrets under the new key, what it sealed meanwhile too. ", dataDir, held)
	}
	fmt.Fprintf(stdout, "%s: a new key is its first line (%d keys now). %s"+
		"Once its log says every sealed value opens with the first key, remove the other lines and start it again. "+
		"Several hosts sharing etcd: see docs/operations.md, \"Rotating the secrets key\"\n", file, n, start)
	return 0
}

// heldDataFile names the bbolt file of dataDir whose values the secrets key seals (registry.db,
// pool.db) that a running server holds open, or "": bbolt holds an exclusive flock on the file
// it serves, so a shared one that cannot be taken means a server runs on it.
func heldDataFile(dataDir string) string {
	if dataDir == "" {
		return ""
	}
	for _, name := range []string{"registry.db", "pool.db"} {
		f, err := os.Open(filepath.Join(dataDir, name))
		if err != nil {
			continue
		}
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		}
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return name
		}
	}
	return ""
}

// sealsWithTheSecretsKey says whether the binary name opens a secrets key file (secretsBox):
// the registry's secrets and the pool's users' tokens; the publisher and the audit log keep none.
func sealsWithTheSecretsKey(name string) bool {
	switch name {
	case "ringfenced", "ringfence-registry", "ringfence-pool":
		return true
	}
	return false
}

// fileFlag takes --file FILE (or --file=FILE, -file) out of args: the key file, and the other
// arguments, which must be empty when a file is named.
func fileFlag(args []string) (file string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--file" || a == "-file":
			if i+1 == len(args) || args[i+1] == "" {
				return "", nil, errors.New("--file needs the key file's path")
			}
			file = args[i+1]
			i++
		case strings.HasPrefix(a, "--file=") || strings.HasPrefix(a, "-file="):
			_, file, _ = strings.Cut(a, "=")
			if file == "" {
				return "", nil, errors.New("--file needs the key file's path")
			}
		default:
			rest = append(rest, a)
		}
	}
	if file != "" && len(rest) > 0 {
		return "", nil, fmt.Errorf("unexpected argument %q: with --file, nothing else is read", rest[0])
	}
	return file, rest, nil
}
