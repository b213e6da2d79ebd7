package audit

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// fileOutbox keeps records in append-only segment files in a directory of its own:
//
//	<dir>/<first sequence, 16 hex digits>.seg  frames: length u32 | crc32c(seq, body) u32 | seq u64 | body
//	<dir>/acked                                 the highest sequence forwarded (8 bytes)
//	<dir>/dropped                               records dropped and not yet reported (8 bytes)
//
// A commit is one write and one fdatasync, against bbolt's page writes and two syncs, which
// matters to a producer that waits for every record (the pool answers a call only once its
// record is durable). The segment is zero-filled ahead of its frames (zeroAhead at a time), so
// most commits overwrite blocks the file system has already written and their fdatasync
// flushes data alone; a write into a hole or an allocated-but-unwritten extent also commits
// the file system's journal (on ext4 a commit of a few records took a quarter longer; see
// docs/benchmarks.md). Sequences are contiguous within a segment and across segments;
// frames past the last good one in a segment (a torn write) are cut at open. The acked file
// is renamed into place without a sync: losing it only resends records, and the audit log
// drops a record it already holds by id.
type fileOutbox struct {
	dir        string
	log        *slog.Logger
	segmentMax int64 // a new segment starts once the last would grow past this

	wmu sync.Mutex // serializes writers: add and remove
	f   *os.File   // the last segment, open for appending; nil until the next add needs one
	// zeroedTo is how far f has been written, frames and the zeros ahead of them.
	zeroedTo int64
	// broken is set when a failed write could not be undone: the last segment's tail is
	// unknown, so nothing more is written (fail closed) until a restart reads it back.
	broken error

	mu      sync.Mutex // guards the state readers see
	segs    []segment
	next    uint64 // sequence of the next record
	acked   uint64
	dropped uint64
	pending int
	closed  bool

	// recent are the records this process committed from sequence recentFirst on, in order,
	// kept until they are forwarded and deleted (recentMaxBytes of bodies at most), so that the
	// forwarder takes them from memory instead of reading their frames back and decoding them.
	recent      []recentRecord
	recentFirst uint64
	recentBytes int

	rmu sync.Mutex // the forwarder's read position, so each batch starts where the last ended
	cur readCursor
}

// recentRecord is a committed record as its producer handed it over.
type recentRecord struct {
	body []byte
	rec  *Record
}

// recentMaxBytes bounds the bodies fileOutbox.recent holds: a linger's worth of calls and more.
// Past it the oldest are let go (the forwarder is behind: the audit log is down or slow), and
// are read back from the segment when their turn comes.
const recentMaxBytes = 1 << 20

type segment struct {
	first, last uint64 // sequences held; last == first-1 when empty
	path        string
	size        int64 // bytes of whole, durable frames
}

type readCursor struct {
	path string
	f    *os.File
	off  int64  // offset of the frame with sequence next
	next uint64 // 0: no position
}

const (
	segmentMaxBytes = 8 << 20
	// zeroAhead is how much of a segment one commit zero-fills past its frames when it
	// reaches the end of what was filled before: one commit in every few hundred.
	zeroAhead       = 1 << 20
	frameHeaderSize = 16
	// maxFrameBody bounds one record's body: a longer length field is damage, not data.
	maxFrameBody = 64 << 20
	ackedFile    = "acked"
	droppedFile  = "dropped"
	segmentExt   = ".seg"
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// zeros is what a segment is filled with ahead of its frames, allocated by the first process
// that spools (the CLI and the services that import this package never do).
var zeros = sync.OnceValue(func() []byte { return make([]byte, zeroAhead) })

func frameCRC(seq uint64, body []byte) uint32 {
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	return crc32.Update(crc32.Update(0, crcTable, s[:]), crcTable, body)
}

func appendFrame(buf []byte, seq uint64, body []byte) []byte {
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(body)))
	buf = binary.BigEndian.AppendUint32(buf, frameCRC(seq, body))
	buf = binary.BigEndian.AppendUint64(buf, seq)
	return append(buf, body...)
}

// parseFrame decodes the frame at the start of data; ok is false when data holds no whole,
// intact frame.
func parseFrame(data []byte) (seq uint64, body []byte, n int, ok bool) {
	if len(data) < frameHeaderSize {
		return 0, nil, 0, false
	}
	size := binary.BigEndian.Uint32(data)
	if size > maxFrameBody || len(data) < frameHeaderSize+int(size) {
		return 0, nil, 0, false
	}
	seq = binary.BigEndian.Uint64(data[8:])
	body = data[frameHeaderSize : frameHeaderSize+int(size)]
	if binary.BigEndian.Uint32(data[4:]) != frameCRC(seq, body) {
		return 0, nil, 0, false
	}
	return seq, body, frameHeaderSize + int(size), true
}

func segmentName(first uint64) string { return fmt.Sprintf("%016x%s", first, segmentExt) }

func seqKey(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

func openFileOutbox(dir string, log *slog.Logger) (*fileOutbox, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit: create spool directory: %w", err)
	}
	o := &fileOutbox{dir: dir, log: log, segmentMax: segmentMaxBytes}
	var err error
	if o.acked, err = readCounter(filepath.Join(dir, ackedFile)); errors.Is(err, errDamagedCounter) {
		// acked is written without a sync (a lost update only resends records, which the
		// log keeps one of each of), so a crash can leave it torn: start over from 0.
		log.Warn("audit: the spool's acked counter is damaged; forwarding every segment again (the audit log drops the duplicates)", "err", err)
		o.acked = 0
	} else if err != nil {
		return nil, err
	}
	// The acked counter exists from the start: on a full disk it is overwritten in place
	// (writeCounter), and a file that does not exist yet could not be written then.
	if _, err := os.Stat(filepath.Join(dir, ackedFile)); errors.Is(err, os.ErrNotExist) {
		if err := writeCounter(filepath.Join(dir, ackedFile), o.acked, true); err != nil {
			return nil, err
		}
	}
	if o.dropped, err = readCounter(filepath.Join(dir, droppedFile)); err != nil {
		return nil, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: read spool directory: %w", err)
	}
	var lost, lastBeyond uint64
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, segmentExt) {
			continue
		}
		first, perr := strconv.ParseUint(strings.TrimSuffix(name, segmentExt), 16, 64)
		if perr != nil || len(name) != 16+len(segmentExt) || first == 0 {
			return nil, fmt.Errorf("audit: %s is not a spool segment: move it out of the spool directory %s", name, dir)
		}
		seg, torn, beyond, err := scanSegment(filepath.Join(dir, name), first)
		if err != nil {
			return nil, err
		}
		if torn && beyond == 0 {
			// The tail after the last intact frame never became durable (its commit failed or
			// was cut by a crash): cut it so appends follow good frames.
			log.Warn("audit: spool segment ends in an incomplete frame; cutting it", "segment", seg.path, "at_byte", seg.size)
		}
		if beyond > 0 {
			// Intact frames follow the damage: durable, acknowledged records are about to be
			// cut. Keep the whole segment aside (not named .seg, so never read as one) for
			// recovery by hand.
			aside := fmt.Sprintf("%s.damaged-%d", seg.path, time.Now().UnixNano())
			if err := copyFile(seg.path, aside); err != nil {
				return nil, fmt.Errorf("audit: keep the damaged spool segment %s aside: %w", seg.path, err)
			}
			log.Error("audit: spool segment is damaged before its last frames; cutting it", "segment", seg.path, "at_byte", seg.size, "kept_as", aside)
		}
		// Also gives back the zeros ahead of the frames.
		if err := os.Truncate(seg.path, seg.size); err != nil {
			return nil, fmt.Errorf("audit: cut spool segment: %w", err)
		}
		if n := len(o.segs); n > 0 {
			prev := o.segs[n-1]
			if want := prev.last + 1; seg.first > want && prev.last >= o.acked {
				// Records between two segments are gone: say how many in the trail.
				gone := seg.first - max(want, o.acked+1)
				log.Error("audit: spool records were lost to damage", "segment", prev.path, "records", gone)
				lost += gone
			} else if seg.first < want {
				return nil, fmt.Errorf("audit: spool segments %s and %s overlap: the spool directory %s was edited", prev.path, seg.path, dir)
			}
		}
		o.segs = append(o.segs, seg)
		lastBeyond = beyond
	}
	// Records lost inside a segment that another follows show as the gap before it (above);
	// in the last segment nothing follows, so the intact frames found past the damage say
	// how many. The segment is cut now, so a later open does not count them again.
	if n := len(o.segs); n > 0 && lastBeyond > o.acked {
		last := o.segs[n-1]
		gone := lastBeyond - max(last.last, o.acked)
		log.Error("audit: spool records were lost to damage", "segment", last.path, "records", gone)
		lost += gone
	}
	o.next = o.acked + 1
	for _, s := range o.segs {
		o.next = max(o.next, s.last+1)
		o.pending += s.count(o.acked)
	}
	if lost > 0 {
		o.dropped += lost
		if err := writeCounter(filepath.Join(dir, droppedFile), o.dropped, true); err != nil {
			return nil, err
		}
	}
	if err := o.deleteForwarded(); err != nil {
		return nil, err
	}
	return o, nil
}

// count returns how many of the segment's records come after acked.
func (s segment) count(acked uint64) int {
	if s.last < s.first || s.last <= acked {
		return 0
	}
	return int(s.last - max(s.first, acked+1) + 1)
}

// scanSegment reads a segment's intact frames, which must carry first, first+1, ...; torn
// is true when bytes follow the last of them. beyond is the highest sequence of an intact
// frame found after that point (0 for none): a torn write leaves none, while damage in the
// middle of the segment leaves the frames after it intact, and they are lost when it is cut.
func scanSegment(path string, first uint64) (seg segment, torn bool, beyond uint64, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return segment{}, false, 0, fmt.Errorf("audit: read spool segment: %w", err)
	}
	seg = segment{first: first, last: first - 1, path: path}
	for int(seg.size) < len(data) {
		seq, _, n, ok := parseFrame(data[seg.size:])
		if !ok || seq != seg.last+1 {
			// Zeros are filled ahead of the frames, not damage.
			rest := data[seg.size:]
			if !slices.ContainsFunc(rest, func(b byte) bool { return b != 0 }) {
				return seg, false, 0, nil
			}
			for off := 1; off+frameHeaderSize <= len(rest); off++ {
				if seq, _, _, ok := parseFrame(rest[off:]); ok && seq > seg.last {
					beyond = max(beyond, seq)
				}
			}
			return seg, true, beyond, nil
		}
		seg.last = seq
		seg.size += int64(n)
	}
	return seg, false, 0, nil
}

// copyFile copies src to dst, durably.
func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return writeSynced(dst, os.O_TRUNC, data)
}

func (o *fileOutbox) describe() string { return o.dir }

func (o *fileOutbox) count() (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return 0, errOutboxClosed
	}
	return o.pending, nil
}

func (o *fileOutbox) add(bodies [][]byte, recs []*Record, admit func(int) error) ([]error, error) {
	o.wmu.Lock()
	defer o.wmu.Unlock()
	o.mu.Lock()
	closed, pending, next, dropped := o.closed, o.pending, o.next, o.dropped
	o.mu.Unlock()
	if closed {
		return nil, errOutboxClosed
	}
	errs := make([]error, len(bodies))
	size := 0
	for _, body := range bodies {
		size += frameHeaderSize + len(body)
	}
	frames := make([]byte, 0, size)
	var n, drops uint64
	var written []recentRecord
	if recs != nil {
		written = make([]recentRecord, 0, len(bodies))
	}
	for i, body := range bodies {
		switch err := admit(pending + int(n)); {
		case err == nil:
			frames = appendFrame(frames, next+n, body)
			n++
			if recs != nil {
				written = append(written, recentRecord{body: body, rec: recs[i]})
			}
		case errors.Is(err, errDropRecord):
			drops++
			errs[i] = err
		default:
			errs[i] = err
		}
	}
	if drops > 0 {
		if err := writeCounter(filepath.Join(o.dir, droppedFile), dropped+drops, true); err != nil {
			return nil, err
		}
		o.mu.Lock()
		o.dropped += drops
		o.mu.Unlock()
	}
	if n > 0 {
		if err := o.appendFrames(frames, next, n, written); err != nil {
			return nil, err
		}
	}
	return errs, nil
}

// appendFrames writes n frames, the first with sequence first, and syncs them; written are the
// records they hold, when the caller has them (all n, or none). The caller holds wmu.
func (o *fileOutbox) appendFrames(frames []byte, first, n uint64, written []recentRecord) error {
	if o.broken != nil {
		return o.broken
	}
	o.mu.Lock()
	var last segment
	if len(o.segs) > 0 {
		last = o.segs[len(o.segs)-1]
	}
	o.mu.Unlock()
	if o.f == nil || last.size+int64(len(frames)) > o.segmentMax && last.size > 0 {
		if err := o.startSegment(first); err != nil {
			return err
		}
	}
	o.mu.Lock()
	off := o.segs[len(o.segs)-1].size
	o.mu.Unlock()
	_, err := o.f.WriteAt(frames, off)
	if end := off + int64(len(frames)); err == nil && end > o.zeroedTo {
		// The same sync makes the zeros durable: the commits after this one only overwrite.
		fill := min(zeroAhead, max(o.segmentMax-end, 0))
		if _, err = o.f.WriteAt(zeros()[:fill], end); err == nil {
			o.zeroedTo = end + fill
		}
	}
	if err == nil {
		err = unix.Fdatasync(int(o.f.Fd()))
	}
	if err != nil {
		// After a failed write or sync the file's tail is unknown. Cut it back to the last
		// durable frame, so the next commit writes the same sequences at the same place;
		// starting a new segment instead would leave two segments holding them, which the
		// next start refuses as an edited spool.
		o.zeroedTo = off
		if terr := o.f.Truncate(off); terr != nil || unix.Fdatasync(int(o.f.Fd())) != nil {
			_ = o.f.Close()
			o.f = nil
			o.broken = fmt.Errorf("audit: the spool segment could not be written nor cut back after %v: nothing more is spooled until the pool restarts (check the disk)", err)
		}
		return fmt.Errorf("audit: write spool segment: %w", err)
	}
	o.mu.Lock()
	s := &o.segs[len(o.segs)-1]
	s.last = first + n - 1
	s.size += int64(len(frames))
	o.next = first + n
	o.pending += int(n)
	o.remember(first, n, written)
	o.mu.Unlock()
	return nil
}

// remember keeps the records just committed in recent, which must stay one run of consecutive
// sequences: frames committed without their records (adopted, a report of dropped records)
// empty it. The caller holds mu.
func (o *fileOutbox) remember(first, n uint64, written []recentRecord) {
	if uint64(len(written)) != n || len(o.recent) > 0 && first != o.recentFirst+uint64(len(o.recent)) {
		o.forgetRecent(len(o.recent))
	}
	if uint64(len(written)) != n {
		return
	}
	if len(o.recent) == 0 {
		o.recentFirst = first
	}
	o.recent = append(o.recent, written...)
	for _, w := range written {
		o.recentBytes += len(w.body)
	}
	drop := 0
	for over := o.recentBytes - recentMaxBytes; over > 0; drop++ {
		over -= len(o.recent[drop].body)
	}
	o.forgetRecent(drop)
}

// forgetRecent lets go of the k oldest records in recent. The caller holds mu.
func (o *fileOutbox) forgetRecent(k int) {
	for _, r := range o.recent[:k] {
		o.recentBytes -= len(r.body)
	}
	clear(o.recent[:k]) // the array outlives the slice: keep no body alive through it
	o.recent = o.recent[k:]
	o.recentFirst += uint64(k)
}

// startSegment opens the segment whose first record will be first: a new file, or the last
// segment when it is still empty of intact frames (and so named for first already).
func (o *fileOutbox) startSegment(first uint64) error {
	o.mu.Lock()
	var last segment
	if len(o.segs) > 0 {
		last = o.segs[len(o.segs)-1]
	}
	o.mu.Unlock()
	if o.f != nil {
		// Give back the zeros ahead of the frames of the segment being left.
		err := o.f.Truncate(last.size)
		if cerr := o.f.Close(); err == nil {
			err = cerr
		}
		o.f = nil
		if err != nil {
			return fmt.Errorf("audit: close spool segment: %w", err)
		}
	}
	reuse := last.path != "" && last.first == first
	path := filepath.Join(o.dir, segmentName(first))
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("audit: open spool segment: %w", err)
	}
	if reuse {
		// Whatever follows the intact frames was cut at open or never written.
		if err := f.Truncate(last.size); err != nil {
			f.Close()
			return fmt.Errorf("audit: cut spool segment: %w", err)
		}
	}
	if !reuse {
		if err := syncDir(o.dir); err != nil {
			f.Close()
			return err
		}
		o.mu.Lock()
		o.segs = append(o.segs, segment{first: first, last: first - 1, path: path})
		o.mu.Unlock()
	}
	o.f = f
	o.zeroedTo = 0
	if reuse {
		o.zeroedTo = last.size
	}
	return nil
}

func (o *fileOutbox) read(after []byte, n, maxBytes int) ([]outboxEntry, error) {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return nil, errOutboxClosed
	}
	start := o.acked + 1
	if after != nil {
		start = max(start, binary.BigEndian.Uint64(after)+1)
	}
	if start >= o.recentFirst && start-o.recentFirst < uint64(len(o.recent)) {
		out := o.readRecent(start, n, maxBytes)
		o.mu.Unlock()
		return out, nil
	}
	if len(o.recent) > 0 && start < o.recentFirst {
		n = min(n, int(o.recentFirst-start)) // from there on, the next read takes them from memory
	}
	segs := slices.Clone(o.segs)
	o.mu.Unlock()

	o.rmu.Lock()
	defer o.rmu.Unlock()
	var out []outboxEntry
	size := 0
	for _, s := range segs {
		if s.last < start || s.last < s.first {
			continue
		}
		if o.cur.path != s.path || o.cur.next != start {
			if err := o.seek(s, start); err != nil {
				return nil, err
			}
		}
		for o.cur.off < s.size && len(out) < n {
			chunk := min(s.size-o.cur.off, int64(max(maxBytes-size, 0))+frameHeaderSize, 1<<20)
			data, err := o.readAt(o.cur.off, max(chunk, frameHeaderSize))
			if err != nil {
				return nil, err
			}
			if l := int(binary.BigEndian.Uint32(data)); frameHeaderSize+l > len(data) {
				// One frame longer than the chunk: read it whole.
				if data, err = o.readAt(o.cur.off, int64(frameHeaderSize+min(l, maxFrameBody))); err != nil {
					return nil, err
				}
			}
			before := o.cur.off
			for len(data) > 0 && len(out) < n {
				seq, body, fn, ok := parseFrame(data)
				if !ok {
					break
				}
				if seq != o.cur.next {
					return nil, fmt.Errorf("audit: spool segment %s holds sequence %d where %d belongs", s.path, seq, o.cur.next)
				}
				if len(out) > 0 && size+len(body) > maxBytes {
					return out, nil
				}
				out = append(out, outboxEntry{key: seqKey(seq), body: slices.Clone(body)})
				size += len(body)
				o.cur.off += int64(fn)
				o.cur.next = seq + 1
				data = data[fn:]
			}
			if len(out) > 0 && size >= maxBytes {
				return out, nil
			}
			if o.cur.off == before {
				// Intact at open, damaged since: the operator has to look (see docs/operations.md).
				return nil, fmt.Errorf("audit: spool segment %s is damaged at byte %d: stop the producer, move the segment aside and restart it; the records in it must be recovered by hand", s.path, before)
			}
		}
		if len(out) >= n {
			break
		}
		start = s.last + 1
	}
	return out, nil
}

// readRecent returns up to n of the records in recent from sequence start on, stopping before
// maxBytes of bodies once it has one. The caller holds mu.
func (o *fileOutbox) readRecent(start uint64, n, maxBytes int) []outboxEntry {
	var out []outboxEntry
	size := 0
	for i, r := range o.recent[start-o.recentFirst:] {
		if len(out) == n || len(out) > 0 && size+len(r.body) > maxBytes {
			break
		}
		out = append(out, outboxEntry{key: seqKey(start + uint64(i)), body: r.body, rec: r.rec})
		size += len(r.body)
	}
	return out
}

// seek moves the cursor to the frame with sequence start in segment s, scanning from the
// segment's beginning (once per restart or segment, not per batch).
func (o *fileOutbox) seek(s segment, start uint64) error {
	if o.cur.path != s.path {
		if o.cur.f != nil {
			o.cur.f.Close()
		}
		f, err := os.Open(s.path)
		if err != nil {
			o.cur = readCursor{}
			return fmt.Errorf("audit: open spool segment: %w", err)
		}
		o.cur = readCursor{path: s.path, f: f}
	}
	o.cur.off, o.cur.next = 0, s.first
	for o.cur.next < start && o.cur.off < s.size {
		hdr, err := o.readAt(o.cur.off, frameHeaderSize)
		if err != nil {
			return err
		}
		o.cur.off += frameHeaderSize + int64(binary.BigEndian.Uint32(hdr))
		o.cur.next++
	}
	return nil
}

func (o *fileOutbox) readAt(off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	if _, err := o.cur.f.ReadAt(buf, off); err != nil && !(errors.Is(err, io.EOF)) {
		return nil, fmt.Errorf("audit: read spool segment: %w", err)
	}
	return buf, nil
}

func (o *fileOutbox) remove(through []byte, corrupt uint64, report func(uint64, int) ([]byte, error)) (removed int, reported uint64, err error) {
	o.wmu.Lock()
	defer o.wmu.Unlock()
	t := binary.BigEndian.Uint64(through)
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return 0, 0, errOutboxClosed
	}
	if t > o.acked {
		for _, s := range o.segs {
			removed += s.count(o.acked) - s.count(t)
		}
		o.acked = t
		o.pending -= removed
		if t >= o.recentFirst {
			o.forgetRecent(int(min(t-o.recentFirst+1, uint64(len(o.recent)))))
		}
	}
	acked := o.acked
	o.mu.Unlock()
	if err := writeCounter(filepath.Join(o.dir, ackedFile), acked, false); err != nil {
		return 0, 0, err
	}
	if err := o.deleteForwarded(); err != nil {
		return 0, 0, err
	}

	o.mu.Lock()
	o.dropped += corrupt
	dropped, pending, next := o.dropped, o.pending, o.next
	o.mu.Unlock()
	if dropped == 0 {
		return removed, 0, nil
	}
	body, err := report(dropped, pending)
	if err != nil {
		return 0, 0, err
	}
	if body != nil {
		if err := o.appendFrames(appendFrame(nil, next, body), next, 1, nil); err != nil {
			return 0, 0, err
		}
		reported, dropped = dropped, 0
		o.mu.Lock()
		o.dropped = 0
		o.mu.Unlock()
	}
	if corrupt > 0 || reported > 0 {
		if err := writeCounter(filepath.Join(o.dir, droppedFile), dropped, true); err != nil {
			return 0, 0, err
		}
	}
	return removed, reported, nil
}

// deleteForwarded deletes the segments whose every record is forwarded, the last one too
// (the next commit starts a new one). The caller holds wmu, or is opening the outbox.
func (o *fileOutbox) deleteForwarded() error {
	o.mu.Lock()
	var gone []segment
	keep := o.segs[:0]
	for i, s := range o.segs {
		if s.last <= o.acked && (s.last >= s.first || i < len(o.segs)-1) {
			gone = append(gone, s)
			continue
		}
		keep = append(keep, s)
	}
	lastGone := len(gone) > 0 && len(keep) == 0
	o.segs = keep
	o.mu.Unlock()
	if lastGone && o.f != nil {
		_ = o.f.Close()
		o.f = nil
	}
	for _, s := range gone {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("audit: delete forwarded spool segment: %w", err)
		}
	}
	return nil
}

func (o *fileOutbox) close() error {
	o.wmu.Lock()
	defer o.wmu.Unlock()
	o.mu.Lock()
	o.closed = true
	o.mu.Unlock()
	var err error
	if o.f != nil {
		err = o.f.Close()
		o.f = nil
	}
	o.rmu.Lock()
	if o.cur.f != nil {
		o.cur.f.Close()
	}
	o.cur = readCursor{}
	o.rmu.Unlock()
	return err
}

// errDamagedCounter: a counter file is not 8 bytes.
var errDamagedCounter = errors.New("audit: damaged spool counter")

func readCounter(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("audit: read %s: %w", path, err)
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("%w: %s (%d bytes, want 8): restore it or remove it (records are then forwarded again, and the audit log keeps one of each)", errDamagedCounter, path, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// writeCounter replaces the 8-byte counter file at path; durable also syncs the file and the
// directory, for counts that must survive a crash.
//
// On a full disk the new file cannot be written, and the spool must still record what the
// audit log took: that is what lets it delete forwarded segments, which frees the disk. So a
// counter that exists is then overwritten in place, which needs no new block (8 bytes at
// offset 0 are written whole: they lie in one sector).
func writeCounter(path string, v uint64, durable bool) error {
	err := replaceCounter(path, v, durable)
	if errors.Is(err, unix.ENOSPC) {
		if ierr := overwriteCounter(path, v, durable); ierr == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("audit: write %s: %w", path, err)
	}
	return nil
}

func replaceCounter(path string, v uint64, durable bool) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(binary.BigEndian.AppendUint64(nil, v))
	if err == nil && durable {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp) // an unwritten tmp file would hold what little space is left
		return err
	}
	if durable {
		return syncDir(filepath.Dir(path))
	}
	return nil
}

// overwriteCounter writes v over the existing 8-byte counter at path.
func overwriteCounter(path string, v uint64, durable bool) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(binary.BigEndian.AppendUint64(nil, v), 0)
	if err == nil && durable {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("audit: sync spool directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("audit: sync spool directory: %w", err)
	}
	return nil
}
