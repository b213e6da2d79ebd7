package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"
)

// quarantineLine is one line of a quarantine file.
type quarantineLine struct {
	Time    time.Time       `json:"quarantine_time"`
	Refusal string          `json:"refusal"`
	Record  json.RawMessage `json:"record,omitempty"`
	// Raw holds, base64, a stored body that is not JSON at all (damage), for recovery by hand.
	Raw []byte `json:"raw,omitempty"`
}

// quarantine appends a refused record, as stored, with the refusal to the quarantine file
// (JSON lines) and syncs it.
func (s *Spool) quarantine(body []byte, refusal error) error {
	q := quarantineLine{Time: time.Now().UTC(), Refusal: refusal.Error(), Record: body}
	if !json.Valid(body) {
		q.Record, q.Raw = nil, body
	}
	line, err := json.Marshal(q)
	if err != nil {
		return err
	}
	s.quarantineMu.Lock()
	defer s.quarantineMu.Unlock()
	if fi, err := os.Stat(s.quarantinePath); err == nil && fi.Size()+int64(len(line))+1 > s.maxQuarantine {
		return fmt.Errorf("%w: %s holds %d bytes, limit %d: investigate and requeue or move it aside", ErrQuarantineFull, s.quarantinePath, fi.Size(), s.maxQuarantine)
	}
	return writeSynced(s.quarantinePath, os.O_APPEND, append(line, '\n'))
}

// ErrQuarantineFull: the quarantine file is at its bound (SpoolConfig.MaxQuarantineBytes).
var ErrQuarantineFull = errors.New("audit: the quarantine file is full")

// RequeueQuarantined puts the records of the quarantine file back in the outbox, for an audit
// log that now takes them (typically one upgraded past the producer that wrote them). The
// records go back as they were written, with their IDs, so the log keeps one of each whatever
// was appended before. Once they are durable in the outbox, the file is kept beside itself as
// <file>.requeued-<unix nanoseconds>; a line that no longer decodes as a record stays in a fresh
// quarantine file. It returns how many records were requeued; a missing file is 0.
func (s *Spool) RequeueQuarantined() (int, error) {
	s.quarantineMu.Lock() // the forwarder may quarantine more meanwhile
	defer s.quarantineMu.Unlock()
	raw, err := os.ReadFile(s.quarantinePath)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("audit: read quarantine: %w", err)
	}
	var bodies [][]byte
	var kept bytes.Buffer
	sc := bufio.NewScanner(bytes.NewReader(raw))
	sc.Buffer(nil, len(raw)+1)
	for sc.Scan() {
		line := sc.Bytes()
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var q quarantineLine
		var rec Record
		if json.Unmarshal(line, &q) != nil || json.Unmarshal(q.Record, &rec) != nil || rec.Validate() != nil {
			kept.Write(line)
			kept.WriteByte('\n')
			continue
		}
		bodies = append(bodies, bytes.Clone(q.Record))
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("audit: read quarantine: %w", err)
	}
	if len(bodies) == 0 {
		return 0, nil // only lines that are not records: leave the file as it is
	}
	if n := s.Pending(); n+len(bodies) > s.maxPending {
		return 0, fmt.Errorf("%w: %d records wait and %d would be requeued, limit %d: requeue once the audit log has caught up", ErrSpoolFull, n, len(bodies), s.maxPending)
	}
	// Every record is written: they were counted as dropped when they were set aside, and the
	// bound was checked above.
	if _, err := s.out.add(bodies, nil, func(int) error { return nil }); err != nil {
		return 0, fmt.Errorf("audit: requeue quarantined records: %w", err)
	}
	for range bodies {
		s.noteEnqueued()
	}
	if err := os.Rename(s.quarantinePath, fmt.Sprintf("%s.requeued-%d", s.quarantinePath, time.Now().UnixNano())); err != nil {
		return len(bodies), fmt.Errorf("audit: set the requeued quarantine file aside: %w", err)
	}
	if kept.Len() > 0 {
		if err := writeSynced(s.quarantinePath, os.O_EXCL, kept.Bytes()); err != nil {
			return len(bodies), err
		}
	}
	return len(bodies), nil
}

// writeSynced writes b to the file at path, created if needed and opened with flag besides,
// and syncs it.
func writeSynced(path string, flag int, b []byte) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|flag, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
