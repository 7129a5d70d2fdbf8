package etcdbackend

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/lock/backend"
)

// Waiting acquires, seen by every lock-service process: an acquire that
// waits for a key writes <prefix>/waiting/<key>/<session>.<n> on its session's
// lease while it waits; each process follows that prefix with a watch, so
// that an end of a key's grant can report that someone waits (Waited) and
// the lock service hands the key over before it answers the end.

func (b *Backend) waitingPrefix() string { return b.prefix + "/waiting/" }

// waitingSeq makes each wait's marker a key of its own: a session that
// waits for a key again before the last wait's marker is deleted (in the
// background) keeps its new one.
var waitingSeq atomic.Uint64

// waitingPath is the marker of one wait of session sid for key:
// <prefix>/waiting/<key>/<sid>.<n>.
func (b *Backend) waitingPath(key, sid string) string {
	return b.waitingPrefix() + key + "/" + sid + "." + strconv.FormatUint(waitingSeq.Add(1), 10)
}

// waitingSet is what the watch has told of the waiting acquires: for each
// key, the waits for it and until when (a marker whose delete
// was lost stops counting then, though it stays while its session lives).
type waitingSet struct {
	mu    sync.Mutex
	byKey map[string]map[string]time.Time
}

// parseWaiting splits a marker's key into the lock key and the wait (its
// session and sequence); lock keys hold no "/".
func (b *Backend) parseWaiting(k []byte) (key, wait string, ok bool) {
	rest, ok := strings.CutPrefix(string(k), b.waitingPrefix())
	if !ok {
		return "", "", false
	}
	i := strings.IndexByte(rest, '/')
	if i <= 0 {
		return "", "", false
	}
	return rest[:i], rest[i+1:], true
}

// set records (on) or forgets one wait for key; until is the marker's
// value. Called with w.mu held.
func (w *waitingSet) set(key, wait string, until []byte, on bool) {
	if on {
		if w.byKey[key] == nil {
			w.byKey[key] = map[string]time.Time{}
		}
		t, err := time.Parse(time.RFC3339Nano, string(until))
		if err != nil {
			t = time.Now().Add(backend.MaxWait) // written by an older build: the longest wait
		}
		w.byKey[key][wait] = t
		return
	}
	delete(w.byKey[key], wait)
	if len(w.byKey[key]) == 0 {
		delete(w.byKey, key)
	}
}

// has reports whether a wait for key is still on, as far as the watch has
// told.
func (w *waitingSet) has(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	for _, until := range w.byKey[key] {
		if now.Before(until) {
			return true
		}
	}
	return false
}

// Waiting implements backend.Backend: the marker, whose value is until, is
// written now and deleted by done, in the background (the waiter's answer
// does not wait for it; Close does). Its lease is the session's, so a marker whose
// delete is lost goes with the session, and stops counting at until.
func (b *Backend) Waiting(ctx context.Context, key, sid string, until time.Time) func() {
	lease, ok := parseSessionID(sid)
	if !ok {
		return func() {}
	}
	path := b.waitingPath(key, sid)
	if _, err := b.cli.Put(ctx, path, until.UTC().Format(time.RFC3339Nano), clientv3.WithLease(lease)); err != nil {
		b.log.Debug("could not mark a waiting acquire", "key", key, "session_id", sid, "error", err.Error())
		return func() {}
	}
	return func() {
		b.unmarks.Go(func() {
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if _, err := b.cli.Delete(dctx, path); err != nil {
				b.log.Debug("could not unmark a waiting acquire", "key", key, "session_id", sid, "error", err.Error())
			}
		})
	}
}

// readWaiting fills the waiting set from the markers and returns the
// revision to follow their changes from (Open calls it, and watchWaiting
// again after its watch broke).
func (b *Backend) readWaiting(ctx context.Context) (int64, error) {
	resp, err := b.cli.Get(ctx, b.waitingPrefix(), clientv3.WithPrefix())
	if err != nil {
		return 0, err
	}
	b.waiting.mu.Lock()
	defer b.waiting.mu.Unlock()
	b.waiting.byKey = map[string]map[string]time.Time{}
	for _, kv := range resp.Kvs {
		if key, wait, ok := b.parseWaiting(kv.Key); ok {
			b.waiting.set(key, wait, kv.Value, true)
		}
	}
	return resp.Header.Revision + 1, nil
}

// followWaiting keeps the waiting set until ctx ends: it follows the
// markers' changes from rev (Open's readWaiting), and whenever the watch
// breaks reads them whole again and follows on from there.
func (b *Backend) followWaiting(ctx context.Context, rev int64) {
	for ctx.Err() == nil {
		err := b.watchWaiting(ctx, rev)
		if ctx.Err() != nil {
			return
		}
		b.log.Warn("etcd watch of waiting acquires failed; retrying", "error", err.Error())
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
		rev = 0
	}
}

// watchWaiting applies the markers' changes from rev until the watch
// breaks (rev 0: read them whole first).
func (b *Backend) watchWaiting(ctx context.Context, rev int64) error {
	if rev == 0 {
		rctx, cancel := b.step(ctx)
		var err error
		rev, err = b.readWaiting(rctx)
		cancel()
		if err != nil {
			return err
		}
	}
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	for wr := range b.cli.Watch(wctx, b.waitingPrefix(), clientv3.WithPrefix(), clientv3.WithRev(rev)) {
		if err := wr.Err(); err != nil {
			return err
		}
		b.waiting.mu.Lock()
		for _, ev := range wr.Events {
			if key, wait, ok := b.parseWaiting(ev.Kv.Key); ok {
				b.waiting.set(key, wait, ev.Kv.Value, ev.Type == mvccpb.PUT)
			}
		}
		b.waiting.mu.Unlock()
	}
	return errors.New("watch closed")
}

// WaitingFor reports whether, as far as this process's watch has told, an
// acquire on any lock-service process waits for key (introspection).
func (b *Backend) WaitingFor(key string) bool { return b.waiting.has(key) }
