// Package admin serves ringfence.admin.v1.AdminService on every binary that keeps files in its
// data_dir: what administers the binary itself rather than one service's resources (its online
// backup). internal/app hands it the binary's files, owner by owner.
package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	adminv1 "github.com/ringfence/ringfence/gen/go/ringfence/admin/v1"
	"github.com/ringfence/ringfence/internal/audit"
	"github.com/ringfence/ringfence/internal/auth"
	"github.com/ringfence/ringfence/internal/backup"
)

// ChunkBytes bounds the data of one BackupResponse.
const ChunkBytes = 1 << 20

// DefaultStallTimeout is limits.backup_stall_timeout's default: a backup whose client takes
// no chunk for this long is ended.
const DefaultStallTimeout = time.Minute

// MaxConcurrent bounds the backups one binary sends at once: each holds a chunk or two in
// memory and a read transaction on the file it copies. One more is refused, RESOURCE_EXHAUSTED.
const MaxConcurrent = 2

// ActionBackup is the action of the admin records a backup writes: one as it starts (the files
// it copies) and one once every byte is sent (their sizes and SHA-256).
const ActionBackup = "backup"

// Recorder writes one admin record durably (a producer's spool, or the audit log itself).
type Recorder func(ctx context.Context, rec audit.Record) error

// Config is what the admin service of one binary needs.
type Config struct {
	// Binary names the binary in the summary and the audit records (ringfenced, …).
	Binary string
	// DataDir is the binary's data_dir: every file is sent by its path under it.
	DataDir string
	// StoreBackend is store.backend: bbolt or etcd.
	StoreBackend string
	// SecretsKeyFile is the key that opens the sealed secrets, never copied; "" for none.
	SecretsKeyFile string
	// NotIncluded says what else the binary's state holds that the copy does not.
	NotIncluded []string
	// Sources list the files, in the order they are copied: the producers' before audit.db,
	// so that a record a restored producer no longer holds is in the restored log.
	Sources []backup.Source
	// Record writes the audit records of a backup; Producer names the writer on them.
	Record   Recorder
	Producer string
	Logger   *slog.Logger
	// StallTimeout ends a backup whose client takes no chunk for this long
	// (limits.backup_stall_timeout; DefaultStallTimeout when 0): a client that stops reading
	// would otherwise hold the read transaction of the file being copied, and with it every
	// write that must grow that file, for as long as it keeps its connection open.
	StallTimeout time.Duration
}

// Service implements AdminService.
type Service struct {
	adminv1.UnsafeAdminServiceServer
	cfg     Config
	running chan struct{} // a token per backup being sent, MaxConcurrent at most
}

var _ adminv1.AdminServiceServer = (*Service)(nil)

// New builds the service.
func New(cfg Config) *Service {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	return &Service{cfg: cfg, running: make(chan struct{}, MaxConcurrent)}
}

// fileSummary is what the audit record of a backup says of one file: never its content.
type fileSummary struct {
	Path   string `json:"path"`
	Size   int64  `json:"size,omitempty"`
	SHA256 string `json:"sha256,omitempty"`
}

// Backup streams a consistent copy of the binary's files (see admin.proto).
func (s *Service) Backup(_ *adminv1.BackupRequest, stream adminv1.AdminService_BackupServer) error {
	ctx := stream.Context()
	p, err := auth.PrincipalFrom(ctx)
	if err != nil {
		return err
	}
	// The copy holds every tenant's data: the interceptor resolved this call for every tenant
	// (a key bound to none), or it is refused here too.
	if t, err := auth.TenancyFrom(ctx); err != nil {
		return err
	} else if !t.All {
		return status.Error(codes.PermissionDenied, "admin: a backup copies every tenant's data, and this call acts for one tenant: use a key bound to no tenant")
	}
	select {
	case s.running <- struct{}{}:
		defer func() { <-s.running }()
	default:
		return status.Errorf(codes.ResourceExhausted, "admin: %d backups of this server are being sent already (at most %d at once): wait for one to end, then run it again", MaxConcurrent, MaxConcurrent)
	}
	send := &sender{stream: stream, timeout: s.cfg.StallTimeout}

	var files []backup.File
	defer func() { backup.Release(files) }()
	for _, src := range s.cfg.Sources {
		fs, err := src()
		files = append(files, fs...)
		if err != nil {
			s.cfg.Logger.Error("admin: backup: a file could not be snapshotted", "err", err)
			return status.Error(codes.Internal, "admin: a file of the data_dir could not be snapshotted for the backup: the server's log says which")
		}
	}
	rels := make([]string, len(files))
	started := make([]fileSummary, len(files))
	for i, f := range files {
		if rels[i], err = s.relPath(f.Path); err != nil {
			s.cfg.Logger.Error("admin: backup", "err", err)
			return status.Error(codes.Internal, "admin: a file to back up is not under data_dir: the server's log says which")
		}
		started[i] = fileSummary{Path: rels[i]}
	}

	// Recorded before any byte leaves: a backup that cannot be audited is not taken.
	if err := s.record(ctx, p, map[string]any{"status": "started", "binary": s.cfg.Binary, "files": started}); err != nil {
		s.cfg.Logger.Error("admin: backup refused: its audit record could not be written", "err", err)
		if st, ok := status.FromError(err); ok && st.Code() == codes.Unavailable {
			// An audit instance standing by: its leader writes the records, and takes backups.
			return status.Error(codes.Unavailable, "admin: the backup cannot be recorded in the audit log, so nothing was sent: "+st.Message()+"; back up the leading audit instance")
		}
		return status.Error(codes.Unavailable, "admin: the backup cannot be recorded in the audit log now, so nothing was sent: retry once the audit spool has room (see the server's log)")
	}

	sent := make([]fileSummary, len(files))
	var total int64
	for i, f := range files {
		w := &chunkWriter{send: send, path: rels[i], hash: sha256.New(), buf: make([]byte, 0, ChunkBytes)}
		if err := f.Copy(w); err != nil {
			if w.sendErr != nil {
				// The client went away (its status is the answer), or stopped reading: the
				// read transaction is released as Copy returns.
				return s.sendFailed(w.sendErr, p, rels[i])
			}
			s.cfg.Logger.Error("admin: backup: a file could not be read", "file", f.Path, "err", err)
			return status.Errorf(codes.Internal, "admin: %s could not be read for the backup: the server's log says why", rels[i])
		}
		end := &adminv1.FileEnd{}
		if err := w.flush(end); err != nil {
			return s.sendFailed(err, p, rels[i])
		}
		sent[i] = fileSummary{Path: rels[i], Size: end.GetSize(), SHA256: end.GetSha256()}
		total += end.GetSize()
	}
	// Every byte is sent: the record of what was. If it cannot be written, the start record
	// still names the caller and the files, and the log says why the second is missing.
	if err := s.record(ctx, p, map[string]any{"status": "completed", "binary": s.cfg.Binary, "files": sent, "bytes": total}); err != nil {
		s.cfg.Logger.Error("admin: the audit record of a completed backup could not be written (the record of its start names the caller and the files)", "err", err)
	}
	s.cfg.Logger.Info("admin: backup sent", "actor", p.Actor(), "files", len(files), "bytes", total)
	err = send.send(&adminv1.BackupResponse{Summary: &adminv1.BackupSummary{
		Binary: s.cfg.Binary, StoreBackend: s.cfg.StoreBackend, Files: int32(len(files)), Bytes: total,
		SecretsKeyFile: s.cfg.SecretsKeyFile, NotIncluded: s.cfg.NotIncluded,
	}})
	return s.sendFailed(err, p, "the summary (every file was sent)")
}

// sendFailed is the answer to a backup whose send of what failed with err: the client's own
// status when it went away, or, when it stopped reading, DEADLINE_EXCEEDED, logged, saying
// why it was ended (the read transaction of the file being copied is released as Copy
// returns).
func (s *Service) sendFailed(err error, p auth.Principal, what string) error {
	if !errors.Is(err, errStalled) {
		return err
	}
	s.cfg.Logger.Warn("admin: a backup was ended: its client took no chunk of it for limits.backup_stall_timeout", "actor", p.Actor(), "file", what, "stall_timeout", s.cfg.StallTimeout)
	return status.Errorf(codes.DeadlineExceeded, "admin: the backup was ended: its client took none of %s for %s (limits.backup_stall_timeout), and a backup that is not read must not hold back the server's writes: run it again from a client that reads it, or raise limits.backup_stall_timeout for a very slow link", what, s.cfg.StallTimeout)
}

// errStalled is what sender.send answers when the client took nothing for the stall timeout.
var errStalled = errors.New("admin: the backup's client took no chunk for the stall timeout")

// sender sends a backup's messages, giving up on one the client does not take within timeout.
// grpc-go's Send takes no context and blocks while the client's flow-control window is full,
// which a client that stops reading keeps full for as long as its connection stays open; so
// each Send runs on a goroutine of its own, one at a time, and the handler returns when it does
// not end in time: the returned status ends the stream, and the blocked Send with it (the way
// grpc-go's maintainers give for a per-message timeout, grpc/grpc-go#1229).
type sender struct {
	stream  adminv1.AdminService_BackupServer
	timeout time.Duration
}

func (s *sender) send(msg *adminv1.BackupResponse) error {
	done := make(chan error, 1)
	go func() { done <- s.stream.Send(msg) }()
	t := time.NewTimer(s.timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return errStalled
	}
}

// relPath is path under data_dir, slash-separated.
func (s *Service) relPath(path string) (string, error) {
	dir, err := filepath.Abs(s.cfg.DataDir)
	if err != nil {
		return "", err
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", err
	}
	rel, err := filepath.Rel(dir, abs)
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, ".."+string(filepath.Separator)) {
		return "", fmt.Errorf("admin: %s is not under data_dir %s", path, s.cfg.DataDir)
	}
	return filepath.ToSlash(rel), nil
}

func (s *Service) record(ctx context.Context, p auth.Principal, change map[string]any) error {
	raw, err := json.Marshal(change)
	if err != nil {
		return err
	}
	if raw, err = audit.BoundChange(raw); err != nil {
		return err
	}
	id, name, role := p.AuditActor()
	rec := audit.NewAdminRecord(s.cfg.Producer, "", audit.AdminEvent{
		ActorKeyID: id, ActorKeyName: name, ActorRole: role, Action: ActionBackup,
		ResourceType: "data_dir", ResourceID: s.cfg.Binary, Change: raw,
	})
	if err := rec.Validate(); err != nil {
		return err
	}
	return s.cfg.Record(ctx, rec)
}

// chunkWriter sends what is written to it as BackupResponse messages of ChunkBytes at most,
// hashing and counting it.
type chunkWriter struct {
	send    *sender
	path    string
	hash    hash.Hash
	buf     []byte
	size    int64
	sendErr error
}

func (w *chunkWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := min(len(p), ChunkBytes-len(w.buf))
		w.buf = append(w.buf, p[:k]...)
		p = p[k:]
		if len(w.buf) == ChunkBytes {
			if err := w.flush(nil); err != nil {
				return 0, err
			}
		}
	}
	return n, nil
}

// flush sends the buffered bytes, with end when it is the file's last message.
func (w *chunkWriter) flush(end *adminv1.FileEnd) error {
	if len(w.buf) == 0 && end == nil {
		return nil
	}
	w.hash.Write(w.buf)
	w.size += int64(len(w.buf))
	if end != nil {
		end.Size = w.size
		end.Sha256 = hex.EncodeToString(w.hash.Sum(nil))
	}
	if err := w.send.send(&adminv1.BackupResponse{Path: w.path, Data: w.buf, End: end}); err != nil {
		w.sendErr = err
		return err
	}
	// A fresh buffer: grpc-go does not allow changing a message once it is sent (stats
	// handlers may read it later).
	w.buf = make([]byte, 0, ChunkBytes)
	return nil
}
