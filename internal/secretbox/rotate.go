package secretbox

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// Rotate puts a new key at the head of the key file at path, keeping every line it held after
// it: the new key seals from the next start, and the old ones still open what they sealed until
// it is re-sealed. The file is written aside (mode 0600), synced and renamed over path, so a
// crash leaves the old file or the new one whole, never a mix. It returns how many keys the
// file holds now. A missing file, or one that does not parse, is refused: a rotation never
// replaces the key that opens the data.
//
// A path that is a link is followed: the file it points at is rotated and the link kept, so
// the key file stays where it is kept (a link to a file the deployment manages) and every
// binary whose link points at it reads the new key; replacing the link would leave that file
// without the key that seals from the next start. Target names the file rotated.
//
// Two rotations of one file at once would each read the old file and write their own new key
// first: the last rename would drop the other's key, and with it whatever a start in between
// sealed under it. So a rotation holds an exclusive flock on the file's .lock (beside the file
// rotated, wherever its links are) from its read to its rename, and a second one is refused
// while the first runs.
func Rotate(path string) (keys int, err error) {
	// Read once before the lock, so what is no key file is refused before a lock file is made
	// beside it; the read under the lock is the one rotated.
	if _, err := readRotated(path); err != nil {
		return 0, err
	}
	target, err := Target(path)
	if err != nil {
		return 0, err
	}
	unlock, err := lockForRotation(target)
	if err != nil {
		return 0, err
	}
	defer unlock()
	data, err := readRotated(path)
	if err != nil {
		return 0, err
	}
	old, err := ParseKeys(path, data)
	if err != nil {
		return 0, err
	}
	if len(old) >= MaxKeys {
		return 0, fmt.Errorf("secretbox: key file %s holds %d keys, the most a key file may: start the server so it re-seals under the first key, remove the lines its log says can go, then rotate (the key file is unchanged)", path, len(old))
	}
	if afterRead != nil {
		afterRead()
	}
	path = target
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return 0, fmt.Errorf("secretbox: generate key: %w", err)
	}
	out := []byte(hex.EncodeToString(key) + "\n")
	data = bytes.TrimPrefix(data, []byte(byteOrderMark)) // a mark heads a file, not its second line
	if len(data) > 0 && data[len(data)-1] != '\n' {
		data = append(data, '\n')
	}
	out = append(out, data...)
	tmp := path + ".rotate"
	_ = os.Remove(tmp) // left by a rotation that crashed before its rename: never the live file
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, cannotWrite(tmp, path, err)
	}
	// The new file takes the old one's owner: a root shell rotating the key file of a server
	// that runs as its own user (the systemd units' ringfence) must not leave it a file only
	// root reads. Only root can give a file away; anyone else is its owner already.
	if owner, ok := fileOwner(path); ok && os.Geteuid() == 0 {
		if err := f.Chown(owner.uid, owner.gid); err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
			return 0, fmt.Errorf("secretbox: give %s the owner of %s: %w (the key file is unchanged)", tmp, path, err)
		}
	}
	if _, err = f.Write(out); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return 0, fmt.Errorf("secretbox: write key file %s: %w (the key file is unchanged)", path, err)
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync() // the rename survives a crash; the file is whole either way
		_ = d.Close()
	}
	return len(old) + 1, nil
}

// readRotated reads the key file a rotation rotates.
func readRotated(path string) ([]byte, error) {
	data, err := readKeyFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("secretbox: no key file at %s: name the key file the server uses (secrets_key_file, default <data_dir>/secrets.key); a server creates its first key itself at its first start", path)
	}
	return data, err
}

// afterRead, when set (by tests), runs between a rotation's read of the key file and its write.
var afterRead func()

// lockForRotation takes the exclusive flock on path+".lock" that a rotation of path holds from
// its read to its rename, or refuses when another rotation holds it. The lock file stays: it
// holds nothing, and removing it would let a third rotation lock a new file beside a second
// one still holding the old. It takes the key file's owner, as the key file does, so that
// user can rotate after root did.
func lockForRotation(path string) (unlock func(), err error) {
	name := path + ".lock"
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, cannotWrite(name, path, err)
	}
	if owner, ok := fileOwner(path); ok && os.Geteuid() == 0 {
		_ = f.Chown(owner.uid, owner.gid) // best effort: the lock works either way
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("secretbox: another secrets-key rotate of %s is running (it holds %s): wait for it to end, check the file, and run this one again if you still want another key (the key file is unchanged)", path, name)
		}
		return nil, fmt.Errorf("secretbox: lock %s: %w (the key file is unchanged)", name, err)
	}
	return func() { _ = f.Close() }, nil // closing the file releases the lock
}

// cannotWrite is the refusal of a rotation that cannot make name beside the key file at path.
func cannotWrite(name, path string, err error) error {
	where := "the key file's directory must be writable by this user"
	if errors.Is(err, syscall.EROFS) {
		where = "the key file is on a read-only file system (a mounted secret, say)"
	}
	return fmt.Errorf("secretbox: write %s: %w: %s; or rotate a copy where you may write (cp %s rotated.key, then `secrets-key rotate --file rotated.key` of ringfenced, ringfence-registry or ringfence-pool) and put it in place of the key file the way it is deployed (the key file is unchanged)", name, err, where, path)
}

// Target is the file a key file path names: path itself, or the file a link at path points
// at, through every link. Rotate writes there.
func Target(path string) (string, error) {
	fi, err := os.Lstat(path)
	if err != nil || fi.Mode()&fs.ModeSymlink == 0 {
		return path, nil
	}
	target, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", fmt.Errorf("secretbox: key file %s is a link that does not resolve: %w: point it at the key file, or name the key file itself", path, err)
	}
	return target, nil
}

type owner struct{ uid, gid int }

// fileOwner is the user and group owning path.
func fileOwner(path string) (owner, bool) {
	st, err := os.Stat(path)
	if err != nil {
		return owner{}, false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	if !ok {
		return owner{}, false
	}
	return owner{int(sys.Uid), int(sys.Gid)}, true
}
