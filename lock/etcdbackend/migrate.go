package etcdbackend

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The grant log's earlier layout kept every grant's record at grants/<id>
// from its acquire on (its CreateRevision the token), and an open grant's
// marker open/<id> held only the lock key. Its ids start with the hex of a
// time in nanoseconds, never "0": they sort after every token key. Open
// moves such records to the layout of this version before it serves:
// an ended record to grants/<token>, an open one into its marker (whose
// CreateRevision a put keeps). Each move is conditional on the record not
// having changed since it was read and deletes the old key, so a move is
// done once, whichever replica makes it.

// migrateBatch bounds the records one migration transaction moves (halved
// while etcd refuses it as too large).
const migrateBatch = 32

// migrate moves every record of the earlier layout and reports how many.
func (b *Backend) migrate(ctx context.Context) (int, error) {
	moved := 0
	for {
		resp, err := b.cli.Get(ctx, b.endedEnd(), clientv3.WithRange(clientv3.GetPrefixRangeEnd(b.prefix+"/grants/")),
			clientv3.WithLimit(migrateBatch))
		if err != nil {
			return moved, classify("migrate grant log", err)
		}
		if len(resp.Kvs) == 0 {
			return moved, nil
		}
		var failed error
		inBatches(resp.Kvs, len(resp.Kvs), func(kvs []*mvccpb.KeyValue) error {
			if failed != nil {
				return nil
			}
			ops := make([]clientv3.Op, len(kvs))
			for i, kv := range kvs {
				ops[i] = b.migrateOp(kv)
			}
			_, err := b.cli.Txn(ctx).Then(ops...).Commit()
			if errors.Is(err, rpctypes.ErrTooManyOps) && len(kvs) > 1 {
				return err
			}
			if err != nil {
				failed = err
			}
			return nil
		})
		if failed != nil {
			return moved, classify("migrate grant log", failed)
		}
		moved += len(resp.Kvs)
	}
}

// migrateOp moves one record of the earlier layout, if it is unchanged.
func (b *Backend) migrateOp(kv *mvccpb.KeyValue) clientv3.Op {
	old := string(kv.Key)
	token := kv.CreateRevision
	unchanged := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(old), "=", kv.ModRevision)}
	toEnded := []clientv3.Op{clientv3.OpPut(b.grantPath(token), string(kv.Value)), clientv3.OpDelete(old)}
	var gv grantValue
	if json.Unmarshal(kv.Value, &gv) != nil || gv.EndedAt != nil {
		return clientv3.OpTxn(unchanged, toEnded, nil)
	}
	// Open: into its marker while that is the grant's; a marker gone (or
	// never written) leaves the record with the ended ones, as it was.
	marker := b.openPath(strings.TrimPrefix(old, b.prefix+"/grants/"))
	return clientv3.OpTxn(unchanged, []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(marker), "=", token)},
		[]clientv3.Op{clientv3.OpPut(marker, string(kv.Value)), clientv3.OpDelete(old)},
		toEnded)}, nil)
}
