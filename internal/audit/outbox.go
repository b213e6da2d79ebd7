package audit

import "errors"

// outbox is where a Spool keeps records until the audit log has them: a bucket in the
// producer's bbolt file (boltOutbox), or append-only segment files (fileOutbox). Keys are
// 8-byte big-endian sequence numbers, increasing in enqueue order.
type outbox interface {
	// describe names the outbox in log lines and audit records.
	describe() string
	// count returns how many records wait.
	count() (int, error)
	// add durably appends bodies, in order, in one commit. admit is called once per body, in
	// order, with the number of records waiting before it, and returns nil to write it, errDropRecord to count it as
	// dropped instead, or another error to refuse it (that body's entry in errs). err is a
	// failed commit: then nothing was written. recs, when not nil, are the valid records the
	// bodies encode, which an outbox may hand back from memory instead of reading and decoding
	// the bodies again (outboxEntry.rec).
	add(bodies [][]byte, recs []*Record, admit func(pending int) error) (errs []error, err error)
	// read returns up to n records after key after (from the front when after is nil),
	// stopping before maxBytes of bodies once it has one.
	read(after []byte, n, maxBytes int) ([]outboxEntry, error)
	// remove deletes the records through key through and adds corrupt to the durable count
	// of dropped records; then, if that count is not zero and report returns a body (given
	// the count and the records still waiting), it appends the body and clears the count.
	// It returns how many records it deleted and the count it reported.
	remove(through []byte, corrupt uint64, report func(dropped uint64, pending int) ([]byte, error)) (removed int, reported uint64, err error)
	close() error
}

type outboxEntry struct {
	key, body []byte
	// rec is the record body encodes, when the outbox still had it in memory: it was valid
	// when it was added, and body is its encoding.
	rec *Record
}

// errOutboxClosed ends the forwarder: the outbox's storage was closed under it.
var errOutboxClosed = errors.New("audit: spool storage is closed")
