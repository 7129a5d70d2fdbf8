package lock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/lockhistory"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	"github.com/payouts/payouts/migrations"
)

// loadWorker acquires and releases keys in a loop until stop, recording
// every operation with a definite outcome. A session lost on the way (the
// store was away for longer than its TTL) is replaced; lost counts those.
type loadWorker struct {
	id     int
	url    string
	ttl    time.Duration
	keys   []string
	rec    *recorder
	grants *atomic.Int64
	lost   atomic.Int64
	err    error
}

func (w *loadWorker) run(ctx context.Context, stop <-chan struct{}) {
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	cl, _ := lockclient.New(w.url, lockclient.WithToken(executorToken), lockclient.WithRequestTimeout(2*time.Second))
	open := func() (*lockclient.Session, error) {
		for {
			s, err := lockclient.Open(ctx, w.url, fmt.Sprintf("load-%d", w.id), lockclient.WithToken(executorToken),
				lockclient.WithTTL(w.ttl), lockclient.WithRequestTimeout(2*time.Second))
			if err == nil || ctx.Err() != nil {
				return s, err
			}
			time.Sleep(100 * time.Millisecond) // the store is away: try again shortly
		}
	}
	// drop ends a session whose last step had an unknown outcome: whatever
	// it holds ends with it (closed, or expired if the close fails).
	drop := func(s *lockclient.Session) {
		if s == nil { // open gave up: the test is ending
			return
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_ = s.Close(cctx)
		cancel()
	}
	s, err := open()
	if err != nil {
		w.err = err
		return
	}
	defer func() { drop(s) }()
	for i := 0; !stopped(); i++ {
		if st := s.State(); st != lockclient.Healthy {
			if st == lockclient.Lost {
				w.lost.Add(1)
				drop(s)
				if s, err = open(); err != nil {
					w.err = err
					return
				}
			} else {
				time.Sleep(20 * time.Millisecond)
			}
			continue
		}
		key := w.keys[i%len(w.keys)]
		in := lockhistory.Input{Op: lockhistory.OpAcquire, Key: key, Session: s.ID()}
		call := w.rec.now()
		g, err := s.Acquire(ctx, key, 200*time.Millisecond)
		ret := w.rec.now()
		switch {
		case err == nil:
			w.rec.add(w.id, in, lockhistory.Output{OK: true, Token: g.Token}, call, ret)
			w.grants.Add(1)
		case errors.Is(err, lockclient.ErrLockHeld), errors.Is(err, lockclient.ErrJeopardy), errors.Is(err, lockclient.ErrSessionLost):
			// Nothing was granted. (lock_held answers are not recorded:
			// an acquire whose outcome was unknown may hold a key the
			// history does not show.)
			continue
		default:
			// Unknown outcome: end the session, and with it any grant.
			drop(s)
			if s, err = open(); err != nil {
				w.err = err
				return
			}
			continue
		}
		heldAt := ret
		in = lockhistory.Input{Op: lockhistory.OpRelease, Key: key, Session: s.ID(), Token: g.Token}
		call = w.rec.now()
		err = s.Release(ctx, g)
		ret = w.rec.now()
		switch {
		case err == nil:
			w.rec.add(w.id, in, lockhistory.Output{OK: true}, call, ret)
			continue
		case errors.Is(err, lockclient.ErrNotHeld):
			if !expired(ctx, cl, g.Token) {
				w.rec.add(w.id, in, lockhistory.Output{}, call, ret) // the model judges it
				continue
			}
			call = heldAt // expired some time after it was granted
		default:
			drop(s)
		}
		// The grant ended at some point between call and when the grant
		// log shows it ended.
		if err := waitEnded(ctx, cl, g.Token); err != nil {
			w.err = err
			return
		}
		w.rec.add(w.id, lockhistory.Input{Op: lockhistory.OpExpire, Key: key, Session: in.Session, Token: g.Token}, lockhistory.Output{OK: true}, call, w.rec.now())
		if s.State() == lockclient.Lost {
			if s, err = open(); err != nil {
				w.err = err
				return
			}
		}
	}
}

// TestEtcdLeaderLoss stops the etcd leader while several clients acquire
// and release continuously: sessions survive the election, tokens keep
// increasing and no two grants of a key are live at once.
func TestEtcdLeaderLoss(t *testing.T) {
	dir, err := os.MkdirTemp("", "lock-leader-loss-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := testCtx(t)
	cluster, err := infra.StartEtcd(ctx, dir, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cluster.Close()
	svc := startService(t, store{kind: "etcd", endpoints: cluster.Endpoints(), prefix: "/leaderloss"})
	rec := &recorder{start: time.Now()}
	var grants atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	workers := make([]*loadWorker, 4)
	for i := range workers {
		workers[i] = &loadWorker{id: i, url: svc.URL, ttl: 6 * time.Second, keys: []string{"payout:ll-1", "payout:ll-2"}, rec: rec, grants: &grants}
		wg.Add(1)
		go func() { defer wg.Done(); workers[i].run(ctx, stop) }()
	}
	eventually(t, "grants before the leader stops", func() bool { return grants.Load() >= 20 })
	leader, err := cluster.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader.Stop()
	before := grants.Load()
	eventually(t, "a new leader", func() bool {
		l, err := cluster.Leader(ctx)
		return err == nil && l != leader
	})
	eventually(t, "grants after the election", func() bool { return grants.Load() >= before+20 })
	close(stop)
	wg.Wait()
	for _, w := range workers {
		if w.err != nil {
			t.Fatal(w.err)
		}
		if n := w.lost.Load(); n != 0 {
			t.Errorf("worker %d lost its session %d times across the election", w.id, n)
		}
	}
	checkHistory(t, "etcd-leader-loss", rec)
	checkGrantLog(t, "etcd", svc.URL, countGrants(rec))
}

func countGrants(rec *recorder) int {
	n := 0
	for _, op := range rec.ops {
		if op.Input.(lockhistory.Input).Op == lockhistory.OpAcquire && op.Output.(lockhistory.Output).OK {
			n++
		}
	}
	return n
}

func checkHistory(t *testing.T, name string, rec *recorder) {
	t.Helper()
	res, info := porcupine.CheckOperationsVerbose(lockhistory.Model, rec.ops, 2*time.Minute)
	if res != porcupine.Ok {
		path := fmt.Sprintf("%s/lock-%s-%d.html", os.TempDir(), name, time.Now().UnixNano())
		if err := porcupine.VisualizePath(lockhistory.Model, info, path); err != nil {
			t.Logf("could not write the visualisation: %v", err)
		}
		if f, err := os.Create(path + ".txt"); err == nil {
			for _, op := range rec.ops {
				in, out := op.Input.(lockhistory.Input), op.Output.(lockhistory.Output)
				fmt.Fprintf(f, "%d %d %d %s %s %s %d %v %d\n", op.ClientId, op.Call, op.Return, in.Op, in.Key, in.Session, in.Token, out.OK, out.Token)
			}
			f.Close()
		}
		t.Fatalf("history of %d operations is %v; visualisation: %s", len(rec.ops), res, path)
	}
}

// TestPostgresCrashRestart crashes lockdb's server (immediate stop, no
// checkpoint) under load: tokens after the restart are above every token
// before it, and the grace period keeps a session whose expiry passed
// while the database was down from being expired at once.
func TestPostgresCrashRestart(t *testing.T) {
	dir, err := os.MkdirTemp("", "lock-pg-crash-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx := testCtx(t)
	pg, err := infra.NewPGCluster(infra.PGOptions{Dir: dir, Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer pg.Stop()
	if err := pg.CreateDatabase(ctx, "lockdb", ""); err != nil {
		t.Fatal(err)
	}
	if err := migrations.Apply(ctx, migrations.LockDB, pg.URL("lockdb")); err != nil {
		t.Fatal(err)
	}
	svc := startService(t, store{kind: "postgres", url: pg.URL("lockdb")})
	cl, _ := lockclient.New(svc.URL, lockclient.WithToken(executorToken), lockclient.WithRequestTimeout(2*time.Second))

	// The grace period lasts the longest TTL of any active session: this
	// session, open across the crash, makes it long enough for the test to
	// read the witness's lock within it on a slow machine. It holds nothing.
	const graceTTL = 20 * time.Second
	anchor, err := lockclient.Open(ctx, svc.URL, "grace-anchor", lockclient.WithToken(executorToken), lockclient.WithTTL(graceTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer anchor.Close(ctx)

	// The grace witness: holds a key, and will not be able to renew while
	// the database is down.
	witness, err := lockclient.Open(ctx, svc.URL, "witness", lockclient.WithToken(executorToken), lockclient.WithTTL(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	wg0, err := witness.TryAcquire(ctx, "payout:grace")
	if err != nil {
		t.Fatal(err)
	}

	rec := &recorder{start: time.Now()}
	var grants atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	workers := make([]*loadWorker, 3)
	for i := range workers {
		workers[i] = &loadWorker{id: i, url: svc.URL, ttl: 3 * time.Second, keys: []string{"payout:pc-1", "payout:pc-2"}, rec: rec, grants: &grants}
		wg.Add(1)
		go func() { defer wg.Done(); workers[i].run(ctx, stop) }()
	}
	eventually(t, "grants before the crash", func() bool { return grants.Load() >= 20 })
	if err := pg.Crash(); err != nil {
		t.Fatal(err)
	}
	crashAt := rec.now()
	highBefore := maxToken(rec)
	// Stay down until the witness's server-side expiry has surely passed.
	down := witness.Deadline().Add(3 * time.Second)
	eventually(t, "the witness's expiry to pass while the database is down", func() bool { return time.Now().After(down) })
	if err := pg.Start(ctx); err != nil {
		t.Fatal(err)
	}
	// Grace: the witness's lock is still held once the database is back,
	// although its expiry passed while it was away.
	var l lockclient.LockInfo
	eventually(t, "the lock service to answer again", func() bool {
		l, err = cl.Lock(ctx, "payout:grace")
		return err == nil
	})
	if !l.Held || l.SessionID != witness.ID() || l.Token != wg0.Token {
		t.Fatalf("right after the restart the witness's lock should still be held (grace): %+v", l)
	}
	// ... and then expires normally.
	other, err := lockclient.Open(ctx, svc.URL, "other", lockclient.WithToken(executorToken), lockclient.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	var g *lockclient.Grant
	eventually(t, "the witness's lock to expire after the grace period", func() bool {
		g, err = other.TryAcquire(ctx, "payout:grace")
		if err != nil && !errors.Is(err, lockclient.ErrLockHeld) && !problem.Has(err, problem.Unavailable) {
			t.Fatal(err)
		}
		return err == nil
	})
	if g.Token <= highBefore || g.Token <= wg0.Token {
		t.Fatalf("token after the crash %d is not above %d", g.Token, highBefore)
	}
	after := grants.Load()
	eventually(t, "grants after the restart", func() bool { return grants.Load() >= after+20 })
	close(stop)
	wg.Wait()
	for _, w := range workers {
		if w.err != nil {
			t.Fatal(w.err)
		}
	}
	// Every grant made after the crash has a token above every grant
	// acknowledged before it.
	for _, op := range rec.ops {
		in, out := op.Input.(lockhistory.Input), op.Output.(lockhistory.Output)
		if in.Op == lockhistory.OpAcquire && out.OK && op.Call > crashAt && out.Token <= highBefore {
			t.Fatalf("token %d issued after the crash is not above %d", out.Token, highBefore)
		}
	}
	checkHistory(t, "pg-crash", rec)
	recs, err := cl.AllGrants(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var prev fencing.Token
	for _, r := range recs {
		if r.Token <= prev {
			t.Fatalf("grant log tokens not increasing: %d after %d", r.Token, prev)
		}
		prev = r.Token
		if r.Token == wg0.Token && (r.EndReason == nil || *r.EndReason != "expired") {
			t.Fatalf("the witness's grant should have ended as expired: %+v", r)
		}
	}
}

func maxToken(rec *recorder) fencing.Token {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	var m fencing.Token
	for _, op := range rec.ops {
		if out := op.Output.(lockhistory.Output); out.OK && op.Input.(lockhistory.Input).Op == lockhistory.OpAcquire {
			m = max(m, out.Token)
		}
	}
	return m
}
