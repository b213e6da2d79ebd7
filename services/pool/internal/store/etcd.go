package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/ringfence/ringfence/internal/etcdstore"
)

// The pool's keys in etcd, under <root>/pool/ (etcdstore.Space):
//
//	meta/schema_version           the layout's version (etcdstore.Migrate)
//	runs/<tenant>/<id>            a run's record (Run JSON), whatever its state
//	owned/<host>/<tenant>/<id>    present while the run is running or paused on host: what
//	                              a host restores at start, and what is failed when its lease
//	                              expires
//	hosts/<id>                    a live pool host (Host JSON), bound to its lease
//	tokens/..., token_hashes/...  the MCP front door's agent tokens (tokens_etcd.go)
//	oauth/...                     users' OAuth sign-ins: pending ones, tokens (sealed) and
//	                              listings (oauth_etcd.go)
//
// A run's record and its owned/ key change in one transaction, so they never disagree.
const (
	etcdRuns  = "runs"
	etcdOwned = "owned"
	etcdHosts = "hosts"
)

// etcdMigrations are the etcd layout's schema versions; migrations[i] brings it to i+1.
var etcdMigrations = []etcdstore.Migration{
	func(context.Context, *clientv3.Client, etcdstore.Space) error { return nil }, // v1: runs, hosts, agent tokens
	// v2: users' OAuth sign-ins under oauth/. Nothing in etcd moves (a host brings its pool.db's
	// sign-ins when it starts on etcd: pool's moveSignIns); the version goes up so that an older
	// binary refuses the space instead of keeping sign-ins that no other host would see.
	func(context.Context, *clientv3.Client, etcdstore.Space) error { return nil },
}

// Etcd keeps the run records of every pool host in etcd, with the hosts' leases, the agent
// tokens and the users' OAuth sign-ins. Reads are linearizable (etcd's default), so a run
// started, ended or re-homed on one host is seen so by the next read on any other. Writes are
// transactions that compare the record they read: two hosts that race to change a run (its
// owner ending it while another fails it for a lost lease) cannot both win.
type Etcd struct {
	cli   *clientv3.Client
	space etcdstore.Space
}

// OpenEtcd opens the pool's part of etcd under root (store.etcd_prefix).
func OpenEtcd(ctx context.Context, cli *clientv3.Client, root string) (*Etcd, error) {
	s := &Etcd{cli: cli, space: etcdstore.NewSpace(root, "pool")}
	if err := etcdstore.Migrate(ctx, cli, s.space, etcdMigrations); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Etcd) runKey(tenant, id string) string { return s.space.Key(etcdRuns, tenant, id) }

func (s *Etcd) ownedKey(r Run) string { return s.space.Key(etcdOwned, r.Host, r.Tenant, r.ID) }

// indexOps are the operations that keep owned/ in step when a run goes from before to after
// (before is nil for a new run).
func (s *Etcd) indexOps(before *Run, after Run) []clientv3.Op {
	var ops []clientv3.Op
	if before != nil && before.Active() && (!after.Active() || before.Host != after.Host) {
		ops = append(ops, clientv3.OpDelete(s.ownedKey(*before)))
	}
	if after.Active() && (before == nil || !before.Active() || before.Host != after.Host) {
		ops = append(ops, clientv3.OpPut(s.ownedKey(after), ""))
	}
	return ops
}

// CreateRun stores a new run; an id its tenant has taken is refused.
func (s *Etcd) CreateRun(ctx context.Context, r Run) error {
	val, err := json.Marshal(r)
	if err != nil {
		return err
	}
	key := s.runKey(r.Tenant, r.ID)
	ops := append([]clientv3.Op{clientv3.OpPut(key, string(val))}, s.indexOps(nil, r)...)
	created, err := s.createIfAbsent(ctx, key, ops)
	if err == nil && !created {
		return ErrExists
	}
	return err
}

// createIfAbsent commits ops if key does not exist; created reports whether it did not.
func (s *Etcd) createIfAbsent(ctx context.Context, key string, ops []clientv3.Op) (created bool, err error) {
	err = etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		c, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)}, ops, nil)
		if err != nil {
			return false, err
		}
		created = c.Succeeded
		return true, nil
	})
	return created, err
}

// PutRun records a run's new state, written by the host that owns it: a run another host
// owns now, or that ended, is refused (ErrNotOwner).
func (s *Etcd) PutRun(ctx context.Context, r Run) error {
	_, err := s.UpdateRun(ctx, r.Tenant, r.ID, func(cur *Run) error { return owned(cur, r) })
	return err
}

// UpdateRun reads a run, lets mutate change it, and stores the result if nobody changed the
// run in between; otherwise it reads again and mutate runs again. An error from mutate stores
// nothing and is returned.
func (s *Etcd) UpdateRun(ctx context.Context, tenant, id string, mutate func(*Run) error) (Run, error) {
	key := s.runKey(tenant, id)
	var out Run
	var stop error
	err := etcdstore.Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := s.cli.Get(ctx, key)
		if err != nil {
			return false, etcdstore.Unavailable("read "+key, err)
		}
		if len(resp.Kvs) == 0 {
			stop = ErrNotFound
			return true, nil
		}
		var before Run
		if err := json.Unmarshal(resp.Kvs[0].Value, &before); err != nil {
			return false, fmt.Errorf("store: %s: %w", key, err)
		}
		after := before // indexOps reads only before's host and state, which mutate cannot reach
		if stop = mutate(&after); stop != nil {
			return true, nil
		}
		val, err := json.Marshal(after)
		if err != nil {
			return false, err
		}
		ops := append([]clientv3.Op{clientv3.OpPut(key, string(val))}, s.indexOps(&before, after)...)
		c, err := etcdstore.Commit(ctx, s.cli, []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", resp.Kvs[0].ModRevision)}, ops, nil)
		if err != nil {
			return false, err
		}
		out = after
		return c.Succeeded, nil
	})
	if err != nil {
		return Run{}, err
	}
	return out, stop
}

// GetRun reads one of tenant's runs.
func (s *Etcd) GetRun(ctx context.Context, tenant, id string) (Run, error) {
	var r Run
	err := s.getJSON(ctx, s.runKey(tenant, id), &r)
	return r, err
}

// getJSON reads key's JSON value into v; a missing key is ErrNotFound.
func (s *Etcd) getJSON(ctx context.Context, key string, v any) error {
	resp, err := etcdstore.Get(ctx, s.cli, "read "+key, key)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 {
		return ErrNotFound
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, v); err != nil {
		return fmt.Errorf("store: %s: %w", key, err)
	}
	return nil
}

// ActiveRuns lists the runs host owns that are running or paused.
func (s *Etcd) ActiveRuns(ctx context.Context, host string) ([]Run, error) {
	keys, err := s.ownedRuns(ctx, host)
	if err != nil {
		return nil, err
	}
	out := make([]Run, 0, len(keys))
	for _, k := range keys {
		r, err := s.GetRun(ctx, k.Tenant, k.ID)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.Active() && r.Host == host {
			out = append(out, r)
		}
	}
	return out, nil
}

// RunRef names a run and the host that owns it.
type RunRef struct{ Host, Tenant, ID string }

// ownedRuns lists the runs under owned/<host>/, or under owned/ (every host's) when host is
// empty.
func (s *Etcd) ownedRuns(ctx context.Context, host string) ([]RunRef, error) {
	all := s.space.Prefix(etcdOwned)
	prefix := all
	if host != "" {
		prefix = s.space.Prefix(etcdOwned, host)
	}
	resp, err := etcdstore.Get(ctx, s.cli, "list "+prefix, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, err
	}
	out := make([]RunRef, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if ref, ok := splitOwned(strings.TrimPrefix(string(kv.Key), all)); ok {
			out = append(out, ref)
		}
	}
	return out, nil
}
