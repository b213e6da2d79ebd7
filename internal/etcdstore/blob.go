package etcdstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	rpctypes "go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Limits of a value kept by Blobs. etcd takes at most --max-request-bytes (1.5 MiB by default)
// per request, a transaction included, and 128 operations per transaction.
const (
	// InlineBytes: a value up to this size is stored in its key, in the writer's transaction.
	InlineBytes = 512 << 10
	// ChunkBytes is the most one chunk of a larger value holds.
	ChunkBytes = 1 << 20
	// MaxChunks bounds a value to MaxChunks × ChunkBytes (64 MiB).
	MaxChunks = 64
)

// stagingTTL is how long staged chunks outlive a writer that died before its transaction.
const stagingTTL = 60

const (
	tagInline  = 0
	tagChunked = 1
)

// ErrTooLarge refuses a value past what Blobs keeps (MaxChunks chunks). Nothing failed and
// trying again cannot help: the value must shrink. Its message gives the size and the limit.
var ErrTooLarge = errors.New("etcdstore: the value is more than etcd keeps")

// ErrDamaged means a stored value cannot be read back whole (chunks missing, a digest that
// does not match, a format this binary does not know): the keys were changed by something
// other than Blobs, or lost. Trying again cannot help; the fix is to restore the keys from a
// backup of etcd. Its message names the value.
var ErrDamaged = errors.New("etcdstore: a stored value is damaged")

// ErrStagingExpired means a transaction found the chunks it staged gone (their lease ran out
// before it committed): stage the value again.
var ErrStagingExpired = errors.New("etcdstore: staged chunks expired before the transaction committed")

// Blobs keeps values larger than one etcd request, atomically with the transaction that
// points at them. A value up to InlineBytes is stored in place. A larger one is written first
// as chunks under <prefix><owner>/<id>/, each bound to a lease of this process, and the
// writer's transaction stores a pointer and takes the chunks off the lease (a put that keeps
// their value): if the writer dies or its transaction fails, the lease expires and the chunks
// go with it, so nothing is left that no key points at. Chunks are never changed: a new value
// is a new id, and the writer's transaction deletes the old one's chunks.
type Blobs struct {
	cli    *clientv3.Client
	prefix string
	inline int
	chunk  int

	mu      sync.Mutex
	session *concurrency.Session
}

// NewBlobs keeps chunks under prefix (e.g. space.Prefix("blobs")). inline and chunk override
// InlineBytes and ChunkBytes when positive (tests make them small).
func NewBlobs(cli *clientv3.Client, prefix string, inline, chunk int) *Blobs {
	b := &Blobs{cli: cli, prefix: prefix, inline: InlineBytes, chunk: ChunkBytes}
	if inline > 0 {
		b.inline = inline
	}
	if chunk > 0 {
		b.chunk = chunk
	}
	return b
}

// Staged is a value ready for a transaction: put Value at the key that holds it and add Ops
// to the same transaction.
type Staged struct {
	Value []byte
	Ops   []clientv3.Op
}

type pointer struct {
	ID     string `json:"id"`
	Chunks int    `json:"chunks"`
	Size   int    `json:"size"`
	SHA256 string `json:"sha256"`
}

// Stage prepares data, owned by owner (a path without a trailing slash, e.g. "acme/g"), for a
// transaction. A value too large for MaxChunks is refused (ErrTooLarge); a failure to reach
// etcd is ErrUnavailable.
func (b *Blobs) Stage(ctx context.Context, owner string, data []byte) (Staged, error) {
	if len(data) <= b.inline {
		return Staged{Value: append([]byte{tagInline}, data...)}, nil
	}
	n := (len(data) + b.chunk - 1) / b.chunk
	if n > MaxChunks {
		return Staged{}, fmt.Errorf("%w: %d bytes, and it keeps at most %d (%d chunks of %d bytes)", ErrTooLarge, len(data), MaxChunks*b.chunk, MaxChunks, b.chunk)
	}
	lease, err := b.lease(ctx)
	if err != nil {
		return Staged{}, err
	}
	var idb [16]byte
	_, _ = rand.Read(idb[:])
	sum := sha256.Sum256(data)
	p := pointer{ID: hex.EncodeToString(idb[:]), Chunks: n, Size: len(data), SHA256: hex.EncodeToString(sum[:])}
	st := Staged{}
	for i := range n {
		part := data[i*b.chunk : min((i+1)*b.chunk, len(data))]
		key := b.chunkKey(owner, p.ID, i)
		if _, err := b.cli.Put(ctx, key, string(part), clientv3.WithLease(lease)); err != nil {
			if errors.Is(err, rpctypes.ErrLeaseNotFound) {
				b.dropSession()
			}
			return Staged{}, Unavailable(fmt.Sprintf("stage chunk %d of %d of %s", i+1, n, owner), err)
		}
		// Keeps the value and drops the lease: the chunk now lives as long as its pointer.
		st.Ops = append(st.Ops, clientv3.OpPut(key, "", clientv3.WithIgnoreValue()))
	}
	ptr, err := json.Marshal(p)
	if err != nil {
		return Staged{}, err
	}
	st.Value = append([]byte{tagChunked}, ptr...)
	return st, nil
}

// IsStagingExpired says whether a transaction failed because its staged chunks were gone.
func IsStagingExpired(err error) bool { return errors.Is(err, rpctypes.ErrKeyNotFound) }

// Load returns the value stored as val, reading chunks at revision rev (the revision val was
// read at, so a value replaced since is still read whole; 0 reads the newest). A value that
// cannot be read back whole is ErrDamaged; a failure to reach etcd is ErrUnavailable.
func (b *Blobs) Load(ctx context.Context, owner string, val []byte, rev int64) ([]byte, error) {
	if len(val) == 0 {
		return nil, fmt.Errorf("%w: a value of %s is empty", ErrDamaged, owner)
	}
	switch val[0] {
	case tagInline:
		return val[1:], nil
	case tagChunked:
	default:
		return nil, fmt.Errorf("%w: a value of %s has unknown tag %d", ErrDamaged, owner, val[0])
	}
	var p pointer
	if err := json.Unmarshal(val[1:], &p); err != nil {
		return nil, fmt.Errorf("%w: the pointer to a value of %s does not decode: %w", ErrDamaged, owner, err)
	}
	opts := []clientv3.OpOption{clientv3.WithPrefix()}
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	resp, err := b.cli.Get(ctx, b.chunkPrefix(owner, p.ID), opts...)
	if err != nil {
		return nil, Unavailable("read the chunks of "+owner, err)
	}
	if len(resp.Kvs) != p.Chunks {
		return nil, fmt.Errorf("%w: value %s/%s has %d of its %d chunks (under %s)", ErrDamaged, owner, p.ID, len(resp.Kvs), p.Chunks, b.chunkPrefix(owner, p.ID))
	}
	out := make([]byte, 0, p.Size)
	for _, kv := range resp.Kvs {
		out = append(out, kv.Value...)
	}
	sum := sha256.Sum256(out)
	if len(out) != p.Size || hex.EncodeToString(sum[:]) != p.SHA256 {
		return nil, fmt.Errorf("%w: value %s/%s does not match its digest (chunks under %s)", ErrDamaged, owner, p.ID, b.chunkPrefix(owner, p.ID))
	}
	return out, nil
}

// DeleteOps deletes the chunks of a stored value (none for an inline one), for the transaction
// that replaces or deletes it.
func (b *Blobs) DeleteOps(owner string, val []byte) []clientv3.Op {
	if len(val) == 0 || val[0] != tagChunked {
		return nil
	}
	var p pointer
	if json.Unmarshal(val[1:], &p) != nil || p.ID == "" {
		return nil
	}
	return []clientv3.Op{clientv3.OpDelete(b.chunkPrefix(owner, p.ID), clientv3.WithPrefix())}
}

// DeleteOwnerOp deletes every chunk owner has.
func (b *Blobs) DeleteOwnerOp(owner string) clientv3.Op {
	return clientv3.OpDelete(b.prefix+owner+"/", clientv3.WithPrefix())
}

func (b *Blobs) chunkPrefix(owner, id string) string { return b.prefix + owner + "/" + id + "/" }

func (b *Blobs) chunkKey(owner, id string, i int) string {
	return fmt.Sprintf("%s%04d", b.chunkPrefix(owner, id), i)
}

// lease is this process's staging lease, kept alive while it runs.
func (b *Blobs) lease(ctx context.Context) (clientv3.LeaseID, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.session != nil {
		select {
		case <-b.session.Done():
			b.session = nil
		default:
			return b.session.Lease(), nil
		}
	}
	s, err := concurrency.NewSession(b.cli, concurrency.WithTTL(stagingTTL), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return 0, Unavailable("grant the lease of staged chunks", err)
	}
	b.session = s
	return s.Lease(), nil
}

func (b *Blobs) dropSession() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.session = nil
}

// Close revokes the staging lease: chunks staged for transactions that never ran go now.
func (b *Blobs) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.session == nil {
		return nil
	}
	err := b.session.Close()
	b.session = nil
	return err
}
