// Package backup describes the files a binary keeps in its data_dir as a consistent copy taken
// while it serves (AdminService.Backup): each owner of a file says how to copy it as of one
// instant, so the admin service streams them without knowing what they hold.
package backup

import (
	"io"
	"os"

	bolt "go.etcd.io/bbolt"
)

// File is one file of the data_dir, ready to be copied.
type File struct {
	// Path is the file's path on this host; the copy lays it out by its path under data_dir.
	Path string
	// Copy writes the file's bytes, as of one instant, to w.
	Copy func(w io.Writer) error
	// Release, when set, frees what the snapshot holds (open descriptors) once the copy is
	// sent or abandoned.
	Release func()
}

// Source lists the files of one owner (a service's store, its audit spool) at the moment a
// backup starts. The order of the files is the order they are copied in.
type Source func() ([]File, error)

// Bolt copies a bbolt file inside one read transaction (bbolt's Tx.WriteTo): a point-in-time
// copy that writers go on beside. A write that must grow the file waits until the copy of this
// file ends (bbolt remaps the file only without readers).
func Bolt(db *bolt.DB) File {
	return File{Path: db.Path(), Copy: func(w io.Writer) error {
		return db.View(func(tx *bolt.Tx) error {
			_, err := tx.WriteTo(w)
			return err
		})
	}}
}

// Section copies the first size bytes of f, opened by the caller at the instant the snapshot
// was taken (under the lock its writers hold): bytes appended or a file removed since do not
// change what is copied. Release closes f.
func Section(path string, f *os.File, size int64) File {
	return File{
		Path: path,
		Copy: func(w io.Writer) error {
			_, err := io.Copy(w, io.NewSectionReader(f, 0, size))
			return err
		},
		Release: func() { _ = f.Close() },
	}
}

// Bytes copies content read at the snapshot's instant (a small counter file).
func Bytes(path string, content []byte) File {
	return File{Path: path, Copy: func(w io.Writer) error {
		_, err := w.Write(content)
		return err
	}}
}

// Release frees what every file of files holds.
func Release(files []File) {
	for _, f := range files {
		if f.Release != nil {
			f.Release()
		}
	}
}

// Producer is the files of a service that keeps its state in store and its audit records in a
// spool: store's bbolt file when it keeps one (a store on etcd keeps none), then the spool's
// files.
func Producer(store any, spool interface{ BackupFiles() ([]File, error) }) ([]File, error) {
	var files []File
	if b, ok := store.(interface{ DB() *bolt.DB }); ok {
		files = append(files, Bolt(b.DB()))
	}
	more, err := spool.BackupFiles()
	if err != nil {
		return nil, err
	}
	return append(files, more...), nil
}
