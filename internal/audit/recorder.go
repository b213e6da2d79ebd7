package audit

import bolt "go.etcd.io/bbolt"

// Recorder takes the audit records of one write transaction of a producer's store: what it
// takes commits with the change or not at all. A store hands one to the hooks of its writes:
// TxRecorder for a bbolt transaction, EtcdRecorder for an etcd one.
type Recorder interface {
	Record(rec Record) error
}

// TxRecorder records into tx, the producer's write transaction on the file that holds this
// spool's outbox (EnqueueTx).
func (s *Spool) TxRecorder(tx *bolt.Tx) Recorder { return txRecorder{s, tx} }

type txRecorder struct {
	s  *Spool
	tx *bolt.Tx
}

func (r txRecorder) Record(rec Record) error { return r.s.EnqueueTx(r.tx, rec) }

var _ Recorder = (*EtcdRecorder)(nil)
