package etcdbackend

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/lock/backend"
)

// The grant log's earlier layout kept every grant's record at grants/<id>
// from its acquire on (its CreateRevision the token), and an open grant's
// marker open/<id> held only the lock key. Its ids start with the hex of a
// time in nanoseconds, never "0": they sort after every token key. Open
// moves such records to the layout of this version before it serves:
// an ended record to grants/<token>, an open one into its marker (whose
// CreateRevision a put keeps); then any marker still holding a bare lock
// key gets its record from its lock key, or is recorded as expired when
// that key is gone. Each move is conditional on what it moves not having
// changed since it was read, never overwrites an ended record, and
// deletes the old key, so a move is done once, whichever replica makes it.

// migrateBatch bounds the records one migration transaction moves (halved
// while etcd refuses it as too large).
const migrateBatch = 32

// migrate moves every record and marker of the earlier layout and reports
// how many it moved.
func (b *Backend) migrate(ctx context.Context) (int, error) {
	records, err := b.migrateRecords(ctx)
	if err != nil {
		return records, err
	}
	markers, err := b.migrateMarkers(ctx)
	return records + markers, err
}

// migrateRecords moves the records at grants/<id>, a batch at a time,
// until none is left.
func (b *Backend) migrateRecords(ctx context.Context) (int, error) {
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
		ops := make([]clientv3.Op, len(resp.Kvs))
		for i, kv := range resp.Kvs {
			ops[i] = b.migrateRecord(kv)
		}
		n, err := b.moveBatch(ctx, ops)
		moved += n
		if err != nil {
			return moved, err
		}
	}
}

// migrateRecord moves one record of the earlier layout, if it is unchanged.
func (b *Backend) migrateRecord(kv *mvccpb.KeyValue) clientv3.Op {
	old := string(kv.Key)
	token := kv.CreateRevision
	unchanged := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(old), "=", kv.ModRevision)}
	var gv grantValue
	if json.Unmarshal(kv.Value, &gv) != nil || gv.EndedAt != nil {
		return clientv3.OpTxn(unchanged, []clientv3.Op{b.toEnded(token, string(kv.Value), old)}, nil)
	}
	// Open: into its marker while that is the grant's. Its marker gone (a
	// replica of this version ended the grant, and wrote its record) or
	// never written, the grant is recorded as expired unless its record is
	// there.
	marker := b.openPath(strings.TrimPrefix(old, b.prefix+"/grants/"))
	return clientv3.OpTxn(unchanged, []clientv3.Op{clientv3.OpTxn(
		[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(marker), "=", token)},
		[]clientv3.Op{clientv3.OpPut(marker, string(kv.Value)), clientv3.OpDelete(old)},
		[]clientv3.Op{b.toEnded(token, expiredNow(gv), old)})}, nil)
}

// migrateMarkers gives each open marker that holds a bare lock key (not a
// record) its record: from its lock key while that is the grant's, else
// as an expired grant. Each is read once, in key order.
func (b *Backend) migrateMarkers(ctx context.Context) (int, error) {
	moved := 0
	from, end := b.openPath(""), clientv3.GetPrefixRangeEnd(b.openPath(""))
	for {
		resp, err := b.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(migrateBatch))
		if err != nil {
			return moved, classify("migrate open markers", err)
		}
		var bare []*mvccpb.KeyValue
		for _, kv := range resp.Kvs {
			if len(kv.Value) == 0 || kv.Value[0] != '{' {
				bare = append(bare, kv)
			}
		}
		if len(bare) > 0 {
			reads := make([]clientv3.Op, len(bare))
			for i, kv := range bare {
				reads[i] = clientv3.OpGet(b.lockPath(string(kv.Value)))
			}
			locks, err := b.cli.Txn(ctx).Then(reads...).Commit()
			if err != nil {
				return moved, classify("migrate open markers", err)
			}
			ops := make([]clientv3.Op, len(bare))
			for i, kv := range bare {
				ops[i] = b.migrateMarker(kv, locks.Responses[i].GetResponseRange().GetKvs())
			}
			n, err := b.moveBatch(ctx, ops)
			moved += n
			if err != nil {
				return moved, err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return moved, nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// migrateMarker is the move of one bare marker, given its lock key as read.
func (b *Backend) migrateMarker(kv *mvccpb.KeyValue, lock []*mvccpb.KeyValue) clientv3.Op {
	marker, key, token := string(kv.Key), string(kv.Value), kv.CreateRevision
	unchanged := clientv3.Compare(clientv3.ModRevision(marker), "=", kv.ModRevision)
	if len(lock) == 1 && lock[0].CreateRevision == token {
		var lv lockValue
		if json.Unmarshal(lock[0].Value, &lv) == nil {
			gv := grantValue{Key: key, Owner: lv.Owner, SessionID: lv.SessionID, GrantedAt: lv.GrantedAt}
			return clientv3.OpTxn([]clientv3.Cmp{unchanged, clientv3.Compare(clientv3.CreateRevision(b.lockPath(key)), "=", token)},
				[]clientv3.Op{clientv3.OpPut(marker, mustJSON(gv))}, nil)
		}
	}
	return clientv3.OpTxn([]clientv3.Cmp{unchanged}, []clientv3.Op{b.toEnded(token, expiredNow(grantValue{Key: key}), marker)}, nil)
}

// toEnded writes value as token's ended record, unless one is there, and
// deletes old.
func (b *Backend) toEnded(token int64, value, old string) clientv3.Op {
	rec := b.grantPath(token)
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(rec), "=", 0)},
		[]clientv3.Op{clientv3.OpPut(rec, value), clientv3.OpDelete(old)},
		[]clientv3.Op{clientv3.OpDelete(old)})
}

// expiredNow is gv recorded as expired now: a grant whose end no
// transaction recorded.
func expiredNow(gv grantValue) string {
	now := time.Now().UTC()
	gv.EndedAt, gv.EndReason, gv.Actor = &now, backend.EndExpired, "lock-service"
	return mustJSON(gv)
}

// moveBatch commits ops (each a conditional move) in transactions of as
// many as etcd takes, and reports how many moves' conditions held.
func (b *Backend) moveBatch(ctx context.Context, ops []clientv3.Op) (int, error) {
	moved := 0
	err := inBatches(ops, len(ops), func(batch []clientv3.Op) error {
		resp, err := b.cli.Txn(ctx).Then(batch...).Commit()
		if err != nil {
			return err
		}
		for _, r := range resp.Responses {
			if r.GetResponseTxn().GetSucceeded() {
				moved++
			}
		}
		return nil
	})
	if err != nil {
		return moved, classify("migrate grant log", err)
	}
	return moved, nil
}
