package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
	"go.etcd.io/bbolt"
)

// TestSecretsKeyRotateCommand: `secrets-key rotate` rotates the key file named by --file, or
// the one the server's configuration names; it prints no key, and a wrong use says how.
func TestSecretsKeyRotateCommand(t *testing.T) {
	run := func(environ []string, args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := secretsKeyCommand("ringfenced", args, environ, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}
	key := strings.Repeat("a1", 32)
	file := filepath.Join(t.TempDir(), "k")
	require.NoError(t, os.WriteFile(file, []byte(key+"\n"), 0o600))
	code, out, errs := run(nil, "rotate", "--file", file)
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, file+": a new key is its first line (2 keys now)")
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Equal(t, key, lines[1])
	require.NotContains(t, out+errs, lines[0])

	dataDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "secrets.key"), []byte(key+"\n"), 0o600))
	code, out, errs = run([]string{"RINGFENCE_DATA_DIR=" + dataDir}, "rotate")
	require.Equal(t, 0, code, errs)
	require.Contains(t, out, filepath.Join(dataDir, "secrets.key")+": a new key is its first line (2 keys now)")

	code, _, errs = run([]string{"RINGFENCE_DATA_DIR=" + t.TempDir()}, "rotate")
	require.Equal(t, 1, code)
	require.Contains(t, errs, "no key file at")
	require.Contains(t, errs, "a server creates its first key itself at its first start")

	code, _, errs = run(nil, "rotate", "--file", file, "--data-dir", "x")
	require.Equal(t, 2, code)
	require.Contains(t, errs, `unexpected argument "--data-dir": with --file, nothing else is read`)
	code, _, errs = run(nil, "new")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "Usage: ringfenced secrets-key rotate")
	code, _, errs = run(nil, "rotate", "--file")
	require.Equal(t, 2, code)
	require.Contains(t, errs, "--file needs the key file's path")
}

// TestSecretsKeyRotateWhileTheServerRuns: a rotation while a server holds registry.db open
// says so: that server seals with the old key until it restarts, so the next step is a
// restart, not a start; with nothing running it says to start it.
func TestSecretsKeyRotateWhileTheServerRuns(t *testing.T) {
	dataDir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "secrets.key"), []byte(strings.Repeat("a1", 32)+"\n"), 0o600))
	db, err := bbolt.Open(filepath.Join(dataDir, "registry.db"), 0o600, nil)
	require.NoError(t, err)
	var stdout, stderr bytes.Buffer
	code := secretsKeyCommand("ringfenced", []string{"rotate"}, []string{"RINGFENCE_DATA_DIR=" + dataDir}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stdout.String(), "A server is running on "+dataDir+" (it holds registry.db open): it goes on sealing with the old key until it starts again. Restart it")

	require.NoError(t, db.Close())
	stdout.Reset()
	code = secretsKeyCommand("ringfenced", []string{"rotate"}, []string{"RINGFENCE_DATA_DIR=" + dataDir}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stdout.String(), "(3 keys now). Start the server")
	require.NotContains(t, stdout.String(), "is running")
}

// TestSecretsKeyRotateOnlyWhereAKeySeals: the publisher and the audit service keep no secrets
// key, so their secrets-key command says which binaries do, rather than look for a key file
// that is never made; the registry and the pool rotate theirs.
func TestSecretsKeyRotateOnlyWhereAKeySeals(t *testing.T) {
	file := filepath.Join(t.TempDir(), "k")
	for _, name := range []string{"ringfence-publisher", "ringfence-audit"} {
		require.NoError(t, os.WriteFile(file, []byte(strings.Repeat("a1", 32)+"\n"), 0o600))
		var stdout, stderr bytes.Buffer
		code := secretsKeyCommand(name, []string{"rotate", "--file", file}, nil, &stdout, &stderr)
		require.Equal(t, 2, code, name)
		require.Contains(t, stderr.String(), name+" keeps no secrets key: only the registry and the pool seal with one (ringfenced, ringfence-registry, ringfence-pool)")
		data, err := os.ReadFile(file)
		require.NoError(t, err)
		require.Equal(t, strings.Repeat("a1", 32)+"\n", string(data), "the file is not rotated")
	}
	for _, name := range []string{"ringfenced", "ringfence-registry", "ringfence-pool"} {
		var stdout, stderr bytes.Buffer
		require.Equal(t, 0, secretsKeyCommand(name, []string{"rotate", "--file", file}, nil, &stdout, &stderr), name+": "+stderr.String())
	}
}

// TestSecretsKeyRotateReadsOnlyWhereTheKeyIs: a split binary's rotation needs only where its
// key file is, not the rest of what the server needs to start (its TLS files, its peers),
// which a shell on the host rarely has; a value that does not parse is still refused.
func TestSecretsKeyRotateReadsOnlyWhereTheKeyIs(t *testing.T) {
	for _, name := range []string{"ringfence-registry", "ringfence-pool"} {
		dataDir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, "secrets.key"), []byte(strings.Repeat("a1", 32)+"\n"), 0o600))
		var stdout, stderr bytes.Buffer
		code := secretsKeyCommand(name, []string{"rotate"}, []string{"RINGFENCE_DATA_DIR=" + dataDir, "RINGFENCE_ENV=production"}, &stdout, &stderr)
		require.Equal(t, 0, code, name+": "+stderr.String())
		require.Contains(t, stdout.String(), filepath.Join(dataDir, "secrets.key")+": a new key is its first line (2 keys now)")
	}
	var stdout, stderr bytes.Buffer
	code := secretsKeyCommand("ringfence-pool", []string{"rotate"}, []string{"RINGFENCE_DATA_DIR=" + t.TempDir(), "RINGFENCE_AUDIT__SPOOL_MAX_RECORDS=many"}, &stdout, &stderr)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), "RINGFENCE_AUDIT__SPOOL_MAX_RECORDS")
	code = secretsKeyCommand("ringfenced", []string{"rotate"}, []string{"RINGFENCE_DATA_DIR="}, &stdout, &stderr)
	require.Equal(t, 2, code)
	require.Contains(t, stderr.String(), "data_dir is empty")
}

// TestSecretsKeyRotateWhileAnotherRotates: while another rotation of the same key file holds
// its lock (secrets.key.lock beside it), `secrets-key rotate` changes nothing and exits 1
// saying another rotation runs and to run it again once that one ended; after it, it rotates.
func TestSecretsKeyRotateWhileAnotherRotates(t *testing.T) {
	key := strings.Repeat("a1", 32)
	file := filepath.Join(t.TempDir(), "secrets.key")
	require.NoError(t, os.WriteFile(file, []byte(key+"\n"), 0o600))
	other, err := os.OpenFile(file+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	require.NoError(t, err)
	defer other.Close()
	require.NoError(t, syscall.Flock(int(other.Fd()), syscall.LOCK_EX|syscall.LOCK_NB))

	var stdout, stderr bytes.Buffer
	code := secretsKeyCommand("ringfence-registry", []string{"rotate", "--file", file}, nil, &stdout, &stderr)
	require.Equal(t, 1, code, stdout.String())
	require.Contains(t, stderr.String(), "ringfence-registry secrets-key rotate: secretbox: another secrets-key rotate of "+file+" is running")
	require.Contains(t, stderr.String(), "run this one again if you still want another key (the key file is unchanged)")
	data, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, key+"\n", string(data))

	require.NoError(t, other.Close()) // the other rotation ended
	stderr.Reset()
	code = secretsKeyCommand("ringfence-registry", []string{"rotate", "--file", file}, nil, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stdout.String(), "(2 keys now)")
}

// TestSecretsKeyRotateThroughALink: a key file linked into data_dir from where the deployment
// keeps it is rotated where the link points, and the output names that file and the link.
func TestSecretsKeyRotateThroughALink(t *testing.T) {
	key := strings.Repeat("a1", 32)
	kept := filepath.Join(t.TempDir(), "ringfence.key")
	require.NoError(t, os.WriteFile(kept, []byte(key+"\n"), 0o600))
	dataDir := t.TempDir()
	link := filepath.Join(dataDir, "secrets.key")
	require.NoError(t, os.Symlink(kept, link))
	var stdout, stderr bytes.Buffer
	code := secretsKeyCommand("ringfenced", []string{"rotate"}, []string{"RINGFENCE_DATA_DIR=" + dataDir}, &stdout, &stderr)
	require.Equal(t, 0, code, stderr.String())
	require.Contains(t, stdout.String(), kept+" (where the link "+link+" points): a new key is its first line (2 keys now)")
	data, err := os.ReadFile(kept)
	require.NoError(t, err)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	require.Equal(t, []string{key}, lines[1:])
	require.NotContains(t, stdout.String()+stderr.String(), lines[0], "the new key is never printed")
}
