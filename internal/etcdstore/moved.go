package etcdstore

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
)

// MovedSuffix is added to the name of a service's bbolt file once a start on etcd has moved
// its state into etcd (registry.db.moved-to-etcd): the file is kept, and no start reads it.
const MovedSuffix = ".moved-to-etcd"

// WarnMovedElsewhere warns, at a start on etcd, when data_dir holds dbPath moved into etcd
// (dbPath+MovedSuffix…) and etcd holds nothing of the service under prefix (empty says so): the
// start names another cluster or prefix than the move's (a typo in store.etcd_prefix, say),
// and would otherwise serve nothing of before without saying why. none says what etcd lacks
// ("no graph"), meanwhile what fails until it is fixed.
func WarnMovedElsewhere(ctx context.Context, log *slog.Logger, service, dbPath, prefix, none, meanwhile string, empty func(context.Context) (bool, error)) {
	moved, _ := filepath.Glob(dbPath + MovedSuffix + "*")
	if len(moved) == 0 {
		return
	}
	if isEmpty, err := empty(ctx); err != nil || !isEmpty {
		return
	}
	name := filepath.Base(dbPath)
	log.Warn(fmt.Sprintf("%s: etcd holds %s under %s, yet %s is left by a move of this data_dir's %s into etcd: "+
		"check that store.etcd_endpoints and store.etcd_prefix name the cluster and prefix it was moved into (%s until then); "+
		"to go back to bbolt instead, rename the file back to %s",
		service, none, prefix, filepath.Base(moved[0]), name, meanwhile, name), "moved_file", moved[0])
}
