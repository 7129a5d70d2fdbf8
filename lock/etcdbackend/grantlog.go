package etcdbackend

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// The grant log (D-9): grants/<id> records, and recording the grants that
// lease expiry ended.

// Grants implements backend.Backend: grant records in CreateRevision (token)
// order.
func (b *Backend) Grants(ctx context.Context, after fencing.Token, limit int) ([]backend.GrantRecord, error) {
	resp, err := b.cli.Get(ctx, b.prefix+"/grants/", clientv3.WithPrefix(), clientv3.WithMinCreateRev(int64(after)+1),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return nil, classify("list grants", err)
	}
	out := make([]backend.GrantRecord, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var gv grantValue
		if err := json.Unmarshal(kv.Value, &gv); err != nil {
			return nil, problem.Wrap(problem.Internal, err, "corrupt grant record %s", kv.Key)
		}
		out = append(out, record(fencing.Token(kv.CreateRevision), gv))
	}
	return out, nil
}

// HighToken implements backend.Backend: the newest grant record's
// CreateRevision.
func (b *Backend) HighToken(ctx context.Context) (fencing.Token, error) {
	resp, err := b.cli.Get(ctx, b.prefix+"/grants/", clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, classify("read high token", err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	return fencing.Token(resp.Kvs[0].CreateRevision), nil
}

// recordExpiry ends the grant of a lock key that vanished without a release
// or revoke transaction (those rewrite the grant record, so the CAS on its
// ModRevision == token fails and nothing is written twice).
func (b *Backend) recordExpiry(ctx context.Context, prev *mvccpb.KeyValue) {
	var lv lockValue
	if err := json.Unmarshal(prev.Value, &lv); err != nil {
		return
	}
	key := strings.TrimPrefix(string(prev.Key), b.prefix+"/locks/")
	b.expireGrant(ctx, key, lv, prev.CreateRevision)
}

func (b *Backend) expireGrant(ctx context.Context, key string, lv lockValue, token int64) {
	ended := time.Now().UTC()
	gv := grantValue{Key: key, Owner: lv.Owner, SessionID: lv.SessionID, GrantedAt: lv.GrantedAt, EndedAt: &ended,
		EndReason: backend.EndExpired, Actor: "lock-service"}
	gp := b.grantPath(lv.GrantID)
	resp, err := b.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(gp), "=", token)).
		Then(clientv3.OpPut(gp, mustJSON(gv)), clientv3.OpDelete(b.openPath(lv.GrantID))).Commit()
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("could not record an expired grant; the sweep will retry", "key", key, "token", token, "error", err.Error())
		}
		return
	}
	if resp.Succeeded {
		b.obs().Expired([]backend.GrantRecord{record(fencing.Token(token), gv)})
	}
}

// sweep checks every open grant against its lock key and records as
// expired those whose key is gone or belongs to a newer grant.
func (b *Backend) sweep(ctx context.Context) {
	resp, err := b.cli.Get(ctx, b.prefix+"/open/", clientv3.WithPrefix())
	if err != nil {
		if ctx.Err() == nil {
			b.log.Warn("sweep of open grants failed", "error", err.Error())
		}
		return
	}
	for _, kv := range resp.Kvs {
		gid := strings.TrimPrefix(string(kv.Key), b.prefix+"/open/")
		key := string(kv.Value)
		token := kv.CreateRevision
		lr, err := b.cli.Get(ctx, b.lockPath(key))
		if err != nil {
			return
		}
		if len(lr.Kvs) > 0 && lr.Kvs[0].CreateRevision == token {
			continue // still held
		}
		gr, err := b.cli.Get(ctx, b.grantPath(gid))
		if err != nil || len(gr.Kvs) == 0 {
			continue
		}
		var gv grantValue
		if json.Unmarshal(gr.Kvs[0].Value, &gv) != nil {
			continue
		}
		b.expireGrant(ctx, key, lockValue{Owner: gv.Owner, SessionID: gv.SessionID, GrantID: gid, GrantedAt: gv.GrantedAt}, token)
	}
	if lr, err := b.cli.Leases(ctx); err == nil {
		b.obs().ActiveSessions(len(lr.Leases))
	}
}
