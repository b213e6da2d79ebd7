package audit

import (
	"bytes"
	"context"
	"fmt"
	"strconv"

	bolt "go.etcd.io/bbolt"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A producer that moves its state from its bbolt file into etcd brings the records its bbolt
// outbox still holds (BoltOutboxRecords) into its etcd outbox (EtcdOutbox.Import), so they are
// sent. A move that stopped in the middle and runs again imports them again: the audit log
// keeps one record per ID, so a record sent twice is stored once.

// BoltOutboxRecords returns the encoded records waiting in the bbolt outbox kept in bucket of
// tx, oldest first, and the count of records dropped under ContinueAndAlarm not yet reported.
// A file without the bucket holds none.
func BoltOutboxRecords(tx *bolt.Tx, bucket string) (bodies [][]byte, dropped uint64, err error) {
	b := tx.Bucket([]byte(bucket))
	if b == nil {
		return nil, 0, nil
	}
	dropped = readUint64(b.Get(spoolDroppedKey))
	q := b.Bucket(spoolRecordsKey)
	if q == nil {
		return nil, dropped, nil
	}
	err = q.ForEach(func(_, v []byte) error {
		bodies = append(bodies, bytes.Clone(v))
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("audit: read the outbox in bucket %q: %w", bucket, err)
	}
	return bodies, dropped, nil
}

// boltOutboxMoveIDKey, inside a bbolt outbox's bucket, names the outbox for its move to etcd.
var boltOutboxMoveIDKey = []byte("move_id")

// BoltOutboxMoveID returns the name of the bbolt outbox kept in bucket of db for its move to
// etcd (EtcdOutbox.Import), made and stored in the bucket at the first call: a move that runs
// again over the same file (it stopped before renaming the file, or a copy of the file was put
// back) finds the same name, and etcd's mark of it. A bbolt outbox opened to serve again
// (openBoltOutbox) forgets the name: what it holds then is for another move.
func BoltOutboxMoveID(db *bolt.DB, bucket string) (string, error) {
	var id string
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists([]byte(bucket))
		if err != nil {
			return err
		}
		if v := b.Get(boltOutboxMoveIDKey); len(v) > 0 {
			id = string(v)
			return nil
		}
		id = randomKey()
		return b.Put(boltOutboxMoveIDKey, []byte(id))
	})
	if err != nil {
		return "", fmt.Errorf("audit: name the outbox in bucket %q for its move to etcd: %w", bucket, err)
	}
	return id, nil
}

// Import writes bodies, records encoded by another outbox of the same producer, into this
// outbox in their order, and dropped as a count of records dropped, for the next report. The
// records were admitted when they were first written, so the outbox's bound does not refuse
// them.
//
// id names the outbox moved (BoltOutboxMoveID). The count goes last, in one transaction with
// moved/<id>, which stays: an import of an id etcd marks as moved writes nothing and returns
// false, so a move that ran again after its import (it stopped before renaming its file) neither
// reports the dropped count twice nor sends its records again. Each earlier transaction holds up
// to etcdOpsPerTxn records: an import that fails in the middle leaves the ones before written,
// and the next writes them again (the log keeps one record per ID); the count, once.
func (o *EtcdOutbox) Import(ctx context.Context, id string, bodies [][]byte, dropped uint64) (imported bool, err error) {
	if o.Client == nil || o.Prefix == "" {
		return false, fmt.Errorf("audit: an etcd outbox needs a client and a prefix")
	}
	if id == "" {
		return false, fmt.Errorf("audit: an import needs the name of the outbox moved (BoltOutboxMoveID)")
	}
	mark := o.Prefix + "moved/" + id
	resp, err := o.Client.Get(ctx, mark, clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("audit: read whether the outbox was moved to etcd: %w", err)
	}
	if resp.Count > 0 {
		return false, nil
	}
	records := o.Prefix + "records/"
	var ops []clientv3.Op
	size := 0
	keys := &txnKeys{}
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		if _, err := o.Client.Txn(ctx).Then(ops...).Commit(); err != nil {
			return fmt.Errorf("audit: write the records moved to the etcd outbox: %w", err)
		}
		ops, size, keys = ops[:0], 0, &txnKeys{}
		return nil
	}
	for _, body := range bodies {
		// A request stays under etcd's default 1.5 MiB; a record is at most a few hundred KiB.
		if len(ops) > 0 && size+len(body) > importTxnBytes {
			if err := flush(); err != nil {
				return false, err
			}
		}
		ops = append(ops, clientv3.OpPut(records+keys.next(), string(body)))
		size += len(body)
		if len(ops) == etcdOpsPerTxn {
			if err := flush(); err != nil {
				return false, err
			}
		}
	}
	if err := flush(); err != nil {
		return false, err
	}
	last := []clientv3.Op{clientv3.OpPut(mark, "")}
	if dropped > 0 {
		last = append(last, clientv3.OpPut(o.Prefix+"dropped/"+randomKey(), strconv.FormatUint(dropped, 10)))
	}
	txn, err := o.Client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(mark), "=", 0)).Then(last...).Commit()
	if err != nil {
		return false, fmt.Errorf("audit: write the records moved to the etcd outbox: %w", err)
	}
	return txn.Succeeded, nil
}

// importTxnBytes bounds the records of one Import transaction.
const importTxnBytes = 1 << 20
