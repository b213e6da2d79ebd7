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

// Import writes bodies, records encoded by another outbox of the same producer, into this
// outbox in their order, and dropped as a count of records dropped, for the next report. The
// records were admitted when they were first written, so the outbox's bound does not refuse
// them. Each transaction holds up to etcdOpsPerTxn records: one that fails leaves the ones
// before it written: a second import writes them again (the log keeps one record per ID) and
// may report the dropped count twice.
func (o *EtcdOutbox) Import(ctx context.Context, bodies [][]byte, dropped uint64) error {
	if o.Client == nil || o.Prefix == "" {
		return fmt.Errorf("audit: an etcd outbox needs a client and a prefix")
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
				return err
			}
		}
		ops = append(ops, clientv3.OpPut(records+keys.next(), string(body)))
		size += len(body)
		if len(ops) == etcdOpsPerTxn {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if dropped > 0 {
		ops = append(ops, clientv3.OpPut(o.Prefix+"dropped/"+randomKey(), strconv.FormatUint(dropped, 10)))
	}
	return flush()
}

// importTxnBytes bounds the records of one Import transaction.
const importTxnBytes = 1 << 20
