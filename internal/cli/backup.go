package cli

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	"github.com/ringfence/ringfence/internal/humanize"
)

func newBackupCmd(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:   "backup --out DIR",
		Short: "Copy the server's data files while it runs, laid out as a data_dir (needs backup, a key bound to no tenant)",
		Long: `backup copies every file the server at --addr keeps in its data_dir (its bbolt files and
the pool's audit spool), each as of one instant, while the server goes on serving. DIR must be
new or empty; it is laid out as a data_dir: to restore, stop the server, point data_dir
(RINGFENCE_DATA_DIR) at DIR (or move the old data_dir aside and DIR into its place: copied over
the old one, files the copy does not hold would stay), put the secrets key beside it, and start it.

The secrets key is never in the copy: keep it apart. In a split deployment each binary owns its
own files: run backup against each (--addr), into a directory of its own. With
store.backend=etcd the state kept in etcd is not in the copy: take it with etcdctl snapshot save.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if out == "" {
				return usagef("--out is required: the directory to write the copy into (new or empty)")
			}
			// The restore line names DIR for a server started elsewhere, from another directory.
			if abs, err := filepath.Abs(out); err == nil {
				out = abs
			}
			made, err := prepareBackupDir(out)
			if err != nil {
				return err
			}
			w := &backupWriter{dir: out, stdout: g.stdout, json: g.output == "json", seen: map[string]bool{}}
			// A backup that does not complete leaves nothing: not its files, nor the
			// directories it made for --out, so no empty copy looks like a backup.
			failed := func(err error) error {
				w.abandon()
				kept := out + " is removed"
				for i := len(made) - 1; i >= 0; i-- {
					_ = os.Remove(made[i]) // only when empty: what this backup made
				}
				if len(made) == 0 {
					kept = out + " is left empty, as it was"
				}
				return &hintedError{err: err, hint: "the backup did not complete and nothing was kept (" + kept + "): fix what the error names, then run it again"}
			}
			conn, err := g.dial()
			if err != nil {
				return failed(err)
			}
			// No deadline: a large file takes as long as it takes; Ctrl-C ends it.
			stream, err := adminv1.NewAdminServiceClient(conn).Backup(g.streamCtx(cmd.Context()), &adminv1.BackupRequest{})
			if err != nil {
				return failed(err)
			}
			summary, err := w.receive(stream)
			if err != nil {
				return failed(err)
			}
			return w.finish(summary)
		},
	}
	cmd.Flags().StringVar(&out, "out", "", "directory to write the copy into, laid out as a data_dir (created; refused when not empty)")
	return cmd
}

// prepareBackupDir creates dir (0700), or takes an empty one: a copy written over another
// data_dir would mix two servers' files. It returns the directories it made, dir's missing
// parents first, for a backup that fails to remove.
func prepareBackupDir(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		var made []string
		for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
			if _, err := os.Lstat(d); err == nil || !errors.Is(err, os.ErrNotExist) || filepath.Dir(d) == d {
				break
			}
			made = append([]string{d}, made...)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, fmt.Errorf("cannot create --out %s: %w: name a directory this user may create", dir, err)
		}
		return made, nil
	case err != nil:
		return nil, usagef("--out %s: %v: name a new or empty directory", dir, err)
	case len(entries) > 0:
		return nil, usagef("--out %s is not empty (it holds %s): name a new or empty directory, so the copy is not mixed with other files", dir, entries[0].Name())
	}
	return nil, os.Chmod(dir, 0o700)
}

// backupWriter lays the streamed files out under dir: each written aside, checked against the
// size and SHA-256 the server sent, synced, then renamed into place.
type backupWriter struct {
	dir    string
	stdout io.Writer
	json   bool

	seen    map[string]bool
	written []string // final paths, for abandon
	files   []backupFileOut

	cur     string // the file being received ("" between files)
	f       *os.File
	tmp     string
	hash    hash.Hash
	size    int64
	created []string // directories made under dir
}

type backupFileOut struct {
	Path   string `json:"path"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

func (w *backupWriter) receive(stream adminv1.AdminService_BackupClient) (*adminv1.BackupSummary, error) {
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("the server ended the backup without its summary: the copy may be incomplete")
		}
		if err != nil {
			return nil, err
		}
		if s := msg.GetSummary(); s != nil {
			if w.cur != "" {
				return nil, fmt.Errorf("the server ended the backup in the middle of %s", w.cur)
			}
			if int(s.GetFiles()) != len(w.files) {
				return nil, fmt.Errorf("the server says it sent %d files, and %d arrived", s.GetFiles(), len(w.files))
			}
			return s, nil
		}
		if err := w.chunk(msg); err != nil {
			return nil, err
		}
	}
}

// safeBackupPath checks a path the server names: relative, slash-separated, clean, inside dir.
func safeBackupPath(p string) error {
	if p == "" || strings.Contains(p, `\`) || path.IsAbs(p) || path.Clean(p) != p || p == "." || p == ".." || strings.HasPrefix(p, "../") {
		return fmt.Errorf("the server sent a file named %q, which is not a plain path under the data_dir: refused", p)
	}
	return nil
}

func (w *backupWriter) chunk(msg *adminv1.BackupResponse) error {
	p := msg.GetPath()
	if p != w.cur {
		if w.cur != "" {
			return fmt.Errorf("the server began %s before it ended %s", p, w.cur)
		}
		if err := safeBackupPath(p); err != nil {
			return err
		}
		if w.seen[p] {
			return fmt.Errorf("the server sent %s twice", p)
		}
		w.seen[p] = true
		if err := w.open(p); err != nil {
			return err
		}
	}
	if _, err := w.f.Write(msg.GetData()); err != nil {
		return fmt.Errorf("write %s: %w", w.tmp, err)
	}
	w.hash.Write(msg.GetData())
	w.size += int64(len(msg.GetData()))
	if end := msg.GetEnd(); end != nil {
		return w.close(end)
	}
	return nil
}

func (w *backupWriter) open(p string) error {
	final := filepath.Join(w.dir, filepath.FromSlash(p))
	if err := w.mkdirs(filepath.Dir(final)); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(final), "."+filepath.Base(final)+".partial-*")
	if err != nil {
		return fmt.Errorf("create a file in %s: %w", filepath.Dir(final), err)
	}
	if err := f.Chmod(0o600); err != nil {
		_ = f.Close()
		return err
	}
	w.cur, w.f, w.tmp, w.hash, w.size = p, f, f.Name(), sha256.New(), 0
	return nil
}

// mkdirs makes the directories from w.dir down to d, 0700, and syncs each parent.
func (w *backupWriter) mkdirs(d string) error {
	rel, err := filepath.Rel(w.dir, d)
	if err != nil || rel == "." {
		return err
	}
	cur := w.dir
	for _, part := range strings.Split(rel, string(filepath.Separator)) {
		cur = filepath.Join(cur, part)
		if err := os.Mkdir(cur, 0o700); errors.Is(err, os.ErrExist) {
			continue
		} else if err != nil {
			return fmt.Errorf("create %s: %w", cur, err)
		}
		w.created = append(w.created, cur)
		if err := syncDir(filepath.Dir(cur)); err != nil {
			return err
		}
	}
	return nil
}

func (w *backupWriter) close(end *adminv1.FileEnd) error {
	sum := hex.EncodeToString(w.hash.Sum(nil))
	if w.size != end.GetSize() || sum != end.GetSha256() {
		return fmt.Errorf("%s arrived as %d bytes with SHA-256 %s, but the server sent %d bytes with SHA-256 %s", w.cur, w.size, sum, end.GetSize(), end.GetSha256())
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", w.tmp, err)
	}
	if err := w.f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", w.tmp, err)
	}
	w.f = nil
	final := filepath.Join(w.dir, filepath.FromSlash(w.cur))
	if err := os.Rename(w.tmp, final); err != nil {
		return fmt.Errorf("rename %s into place: %w", w.tmp, err)
	}
	w.written = append(w.written, final)
	if err := syncDir(filepath.Dir(final)); err != nil {
		return err
	}
	w.files = append(w.files, backupFileOut{Path: w.cur, Size: w.size, SHA256: sum})
	if !w.json {
		fmt.Fprintf(w.stdout, "%-40s %10s  sha256 %s\n", w.cur, humanize.Bytes(w.size), sum[:16])
	}
	w.cur, w.tmp = "", ""
	return nil
}

// abandon removes what a failed backup wrote: the directory was empty before.
func (w *backupWriter) abandon() {
	if w.f != nil {
		_ = w.f.Close()
		_ = os.Remove(w.tmp)
	}
	for _, p := range w.written {
		_ = os.Remove(p)
	}
	for i := len(w.created) - 1; i >= 0; i-- {
		_ = os.Remove(w.created[i])
	}
}

func (w *backupWriter) finish(s *adminv1.BackupSummary) error {
	var total int64
	for _, f := range w.files {
		total += f.Size
	}
	restore := fmt.Sprintf("to restore: stop %s, point its data_dir (RINGFENCE_DATA_DIR) at %s (or move the old data_dir aside and this one into its place, never over it), put the secrets key beside it, and start it", s.GetBinary(), w.dir)
	if s.GetSecretsKeyFile() == "" {
		restore = fmt.Sprintf("to restore: stop %s, point its data_dir (RINGFENCE_DATA_DIR) at %s (or move the old data_dir aside and this one into its place, never over it), and start it", s.GetBinary(), w.dir)
	}
	if len(w.files) == 0 {
		// A registry or publisher on etcd keeps no file: an empty DIR restores nothing, and
		// its state is only where the lines below say.
		where := "the lines above name"
		if w.json {
			where = "not_included names"
		}
		restore = fmt.Sprintf("%s is empty: %s keeps none of its state in its data_dir, so this copy restores nothing; back up what %s", w.dir, s.GetBinary(), where)
	}
	if w.json {
		// Lists are lists when empty too: a script reads "files": [] as no file, and would
		// have to tell null apart.
		files, notIncluded := w.files, s.GetNotIncluded()
		if files == nil {
			files = []backupFileOut{}
		}
		if notIncluded == nil {
			notIncluded = []string{}
		}
		return json.NewEncoder(w.stdout).Encode(map[string]any{
			"dir": w.dir, "binary": s.GetBinary(), "store_backend": s.GetStoreBackend(), "files": files, "bytes": total,
			"secrets_key_file": s.GetSecretsKeyFile(), "not_included": notIncluded, "restore": restore,
		})
	}
	fmt.Fprintf(w.stdout, "backed up %d files (%s) of %s into %s\n", len(w.files), humanize.Bytes(total), s.GetBinary(), w.dir)
	if k := s.GetSecretsKeyFile(); k != "" {
		fmt.Fprintf(w.stdout, "the secrets key is not in the backup: keep %s apart (a copy of it, stored away from the backups)\n", k)
	}
	for _, n := range s.GetNotIncluded() {
		if strings.HasPrefix(n, "the secrets key") {
			continue // said above, in short
		}
		fmt.Fprintf(w.stdout, "not in the backup: %s\n", n)
	}
	fmt.Fprintln(w.stdout, restore)
	return nil
}

// syncDir makes the entries of dir (a rename, a new directory) survive a crash.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
