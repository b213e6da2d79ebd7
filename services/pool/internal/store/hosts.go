package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/ringfence/ringfence/internal/etcdstore"
)

// Host is a live pool host, as it registered itself.
type Host struct {
	ID string `json:"id"`
	// Addr is where the other hosts reach its internal plane (forwarded calls).
	Addr string `json:"addr"`
	// Capacity is how many runs it takes at most (pool.max_runs).
	Capacity  int       `json:"capacity"`
	StartTime time.Time `json:"start_time"`
	// Load is how many runs it owns (running or paused), counted when read; not stored.
	Load int `json:"-"`
}

// ErrHostTaken refuses a host id that a live host registered.
var ErrHostTaken = errors.New("another live pool host registered this id")

// HostLease is a host's registration: its key lives as long as the lease, which the etcd client
// keeps alive. Done is closed when the lease is lost (the cluster did not hear from this
// process within the TTL, and the other hosts may fail its runs).
type HostLease struct {
	session *concurrency.Session
}

// Done is closed when the lease expired or was revoked.
func (l *HostLease) Done() <-chan struct{} { return l.session.Done() }

// Close revokes the lease: the host's key goes at once.
func (l *HostLease) Close() error { return l.session.Close() }

// Register puts h under hosts/<id> bound to a lease of ttl, kept alive until Close; an id a live
// host holds is ErrHostTaken.
func (s *Etcd) Register(ctx context.Context, h Host, ttl time.Duration) (*HostLease, error) {
	secs := max(int(ttl/time.Second), 1)
	session, err := concurrency.NewSession(s.cli, concurrency.WithTTL(secs), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return nil, etcdstore.Unavailable("grant the host's lease", err)
	}
	val, err := json.Marshal(h)
	if err != nil {
		_ = session.Close()
		return nil, err
	}
	key := s.space.Key(etcdHosts, h.ID)
	var taken bool
	err = etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, string(val), clientv3.WithLease(session.Lease()))}, nil)
		if err != nil {
			return false, err
		}
		taken = !resp.Succeeded
		return true, nil
	})
	if err == nil && taken {
		err = fmt.Errorf("%w: %s", ErrHostTaken, h.ID)
	}
	if err != nil {
		_ = session.Close()
		return nil, err
	}
	return &HostLease{session: session}, nil
}

// Hosts lists the live hosts with their loads, by id.
func (s *Etcd) Hosts(ctx context.Context) ([]Host, error) {
	prefix := s.space.Prefix(etcdHosts)
	resp, err := etcdstore.Get(ctx, s.cli, "list "+prefix, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	owned, err := s.ownedRuns(ctx, "")
	if err != nil {
		return nil, err
	}
	load := map[string]int{}
	for _, r := range owned {
		load[r.Host]++
	}
	out := make([]Host, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var h Host
		if err := json.Unmarshal(kv.Value, &h); err != nil {
			return nil, fmt.Errorf("store: %s: %w", kv.Key, err)
		}
		h.Load = load[h.ID]
		out = append(out, h)
	}
	return out, nil
}

// Host reads one live host; a host without a live lease is ErrNotFound.
func (s *Etcd) Host(ctx context.Context, id string) (Host, error) {
	var h Host
	err := s.getJSON(ctx, s.space.Key(etcdHosts, id), &h)
	return h, err
}

// LostHosts lists the hosts that own runs but hold no lease.
func (s *Etcd) LostHosts(ctx context.Context) ([]string, error) {
	owned, err := s.ownedRuns(ctx, "")
	if err != nil {
		return nil, err
	}
	var lost []string
	seen := map[string]bool{}
	for _, r := range owned {
		if seen[r.Host] {
			continue
		}
		seen[r.Host] = true
		if _, err := s.Host(ctx, r.Host); errors.Is(err, ErrNotFound) {
			lost = append(lost, r.Host)
		} else if err != nil {
			return nil, err
		}
	}
	return lost, nil
}

// FailRunsOf ends every running or paused run of host as failed with reason, if host holds no
// lease: each in a transaction that compares the run and the absence of the host's key, so a
// host that registered again in the meantime keeps its runs. fail fills in the record (state,
// reason, time); the run is marked HostLost, which lets ResumeRun re-home it.
func (s *Etcd) FailRunsOf(ctx context.Context, host string, fail func(*Run)) ([]Run, error) {
	refs, err := s.ownedRuns(ctx, host)
	if err != nil {
		return nil, err
	}
	hostKey := s.space.Key(etcdHosts, host)
	var failed []Run
	for _, ref := range refs {
		key := s.runKey(ref.Tenant, ref.ID)
		var done *Run
		err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
			done = nil
			resp, err := s.cli.Get(ctx, key)
			if err != nil {
				return false, etcdstore.Unavailable("read "+key, err)
			}
			var before Run
			if len(resp.Kvs) > 0 {
				if err := json.Unmarshal(resp.Kvs[0].Value, &before); err != nil {
					return false, fmt.Errorf("store: %s: %w", key, err)
				}
			}
			if len(resp.Kvs) == 0 || !before.Active() || before.Host != host {
				// Ended or moved already; only the stale index entry is left.
				_, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(hostKey), "=", 0)).
					Then(clientv3.OpDelete(s.space.Key(etcdOwned, host, ref.Tenant, ref.ID))).Commit()
				return err == nil, etcdstore.Unavailable("drop a stale index entry", err)
			}
			after := before
			fail(&after)
			after.HostLost, after.Host = host, ""
			val, err := json.Marshal(after)
			if err != nil {
				return false, err
			}
			c, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{
				clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision),
				clientv3.Compare(clientv3.CreateRevision(hostKey), "=", 0),
			}, append([]clientv3.Op{clientv3.OpPut(key, string(val))}, s.indexOps(&before, after)...), nil)
			if err != nil {
				return false, err
			}
			if c.Succeeded {
				done = &after
			}
			return c.Succeeded, nil
		})
		if err != nil {
			return failed, err
		}
		if done != nil {
			failed = append(failed, *done)
		}
	}
	return failed, nil
}

// splitOwned splits an owned/ key's rest into host, tenant and id.
func splitOwned(rest string) (RunRef, bool) {
	parts := strings.Split(rest, "/")
	if len(parts) != 3 {
		return RunRef{}, false
	}
	return RunRef{Host: parts[0], Tenant: parts[1], ID: parts[2]}, true
}
