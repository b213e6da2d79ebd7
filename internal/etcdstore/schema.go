package etcdstore

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Migration moves a space from version-1 to its version. It may run on several replicas
// starting at once, so it must be idempotent; it commits its own transactions.
type Migration func(ctx context.Context, cli *clientv3.Client, space Space) error

// Migrate runs every migration past the space's stored schema version (the key
// meta/schema_version) and records the version reached. migrations[i] brings the schema to
// version i+1. A space written by a newer version is refused rather than misread, as
// boltdb.Migrate refuses a newer file.
func Migrate(ctx context.Context, cli *clientv3.Client, space Space, migrations []Migration) error {
	key := space.Key("meta", "schema_version")
	want := len(migrations)
	return Retry(ctx, func(ctx context.Context) (bool, error) {
		resp, err := cli.Get(ctx, key)
		if err != nil {
			return false, Unavailable("read "+key, err)
		}
		current, modRev := 0, int64(0)
		if len(resp.Kvs) > 0 {
			modRev = resp.Kvs[0].ModRevision
			if current, err = strconv.Atoi(string(resp.Kvs[0].Value)); err != nil {
				return false, fmt.Errorf("etcdstore: %s holds %q, not a schema version", key, resp.Kvs[0].Value)
			}
		}
		if current > want {
			return false, fmt.Errorf("etcdstore: %s has schema version %d, newer than this binary knows (%d): run a newer ringfence", space, current, want)
		}
		if current == want && modRev != 0 {
			return true, nil
		}
		for v := current; v < want; v++ {
			if err := migrations[v](ctx, cli, space); err != nil {
				return false, fmt.Errorf("etcdstore: migrate %s to schema version %d: %w", space, v+1, err)
			}
		}
		txn, err := cli.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
			Then(clientv3.OpPut(key, strconv.Itoa(want))).
			Commit()
		if err != nil {
			return false, Unavailable("write "+key, err)
		}
		return txn.Succeeded, nil
	})
}
