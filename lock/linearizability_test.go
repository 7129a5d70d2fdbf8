package lock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/payouts/payouts/dev/lockhistory"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

type recorder struct {
	mu    sync.Mutex
	start time.Time
	ops   []porcupine.Operation
	raced int // keepalives sent around their session's expiry
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) } // monotonic

func (r *recorder) add(client int, in lockhistory.Input, out lockhistory.Output, call, ret int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// TestLinearizableAcrossTwoServices runs 8 clients doing random acquire,
// release, expiry and keepalives racing their own expiry on 2 keys against
// two lock service instances on one backend, each request going to one of
// them at random, and checks the history against the fenced-mutex model. It also checks the grant log:
// tokens strictly increase and every grant but a key's last has ended.
func TestLinearizableAcrossTwoServices(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		st := newStore(t, kind)
		svcs := []*service{startService(t, st), startService(t, st)}
		keys := []string{"payout:lin-1", "payout:lin-2"}
		rec := &recorder{start: time.Now()}
		const clients, opsPerClient = 8, 24
		var wg sync.WaitGroup
		errc := make(chan error, clients)
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := runClient(t, c, svcs, keys, rec, opsPerClient); err != nil {
					errc <- fmt.Errorf("client %d: %w", c, err)
				}
			}()
		}
		wg.Wait()
		close(errc)
		for err := range errc {
			t.Fatal(err)
		}
		res, info := porcupine.CheckOperationsVerbose(lockhistory.Model, rec.ops, 2*time.Minute)
		if res != porcupine.Ok {
			path := filepath.Join(os.TempDir(), fmt.Sprintf("lock-linearizability-%s-%d.html", kind, time.Now().UnixNano()))
			if err := porcupine.VisualizePath(lockhistory.Model, info, path); err != nil {
				t.Logf("could not write the visualisation: %v", err)
			}
			t.Fatalf("history of %d operations is %v; visualisation: %s", len(rec.ops), res, path)
		}
		grants := 0
		for _, op := range rec.ops {
			if in := op.Input.(lockhistory.Input); in.Op == lockhistory.OpAcquire && op.Output.(lockhistory.Output).OK {
				grants++
			}
		}
		if grants < clients || rec.raced == 0 {
			t.Fatalf("only %d grants and %d keepalives racing expiry in the history: the test exercised too little", grants, rec.raced)
		}
		checkGrantLog(t, kind, svcs[0].URL, grants)
	})
}

func runClient(t *testing.T, c int, svcs []*service, keys []string, rec *recorder, nops int) error {
	ctx := testCtx(t)
	rnd := rand.New(rand.NewPCG(uint64(c), 42))
	pick := func() *service { return svcs[rnd.IntN(len(svcs))] }
	open := func() (*lockclient.Session, error) {
		return lockclient.Open(ctx, pick().URL, fmt.Sprintf("client-%d", c), lockclient.WithToken(executorToken), lockclient.WithTTL(5*time.Second))
	}
	// Each operation goes through a session bound to a randomly chosen
	// service instance; all share one session id.
	s, err := open()
	if err != nil {
		return err
	}
	defer func() { _ = s.Close(ctx) }()
	via := func() *lockclient.Client {
		cl, _ := lockclient.New(pick().URL, lockclient.WithToken(executorToken))
		return cl
	}
	var (
		held   *lockclient.GrantInfo
		heldAt int64
	)
	// release releases held and records it; a release refused because the
	// session expired under us (missed keepalives on a loaded machine) is
	// an expiry between the grant and now, and the client opens a new
	// session.
	release := func() error {
		in := lockhistory.Input{Op: lockhistory.OpRelease, Key: held.Key, Session: s.ID(), Token: held.Token}
		call := rec.now()
		err := releaseVia(ctx, via(), s.ID(), held.Key, held.Token)
		ret := rec.now()
		switch {
		case err == nil:
			rec.add(c, in, lockhistory.Output{OK: true}, call, ret)
		case errors.Is(err, lockclient.ErrNotHeld):
			if !expired(ctx, via(), held.Token) {
				rec.add(c, in, lockhistory.Output{}, call, ret)
				return nil
			}
			rec.add(c, lockhistory.Input{Op: lockhistory.OpExpire, Key: held.Key, Session: s.ID(), Token: held.Token}, lockhistory.Output{OK: true}, heldAt, ret)
			_ = s.Close(ctx)
			s, err = open()
			return err
		default:
			return err
		}
		return nil
	}
	for range nops {
		switch {
		case held == nil:
			key := keys[rnd.IntN(len(keys))]
			in := lockhistory.Input{Op: lockhistory.OpAcquire, Key: key, Session: s.ID()}
			call := rec.now()
			g, err := acquireVia(ctx, via(), s.ID(), key, time.Duration(rnd.IntN(3))*100*time.Millisecond)
			ret := rec.now()
			switch {
			case err == nil:
				rec.add(c, in, lockhistory.Output{OK: true, Token: g.Token}, call, ret)
				held = g
			case errors.Is(err, lockclient.ErrLockHeld):
				rec.add(c, in, lockhistory.Output{}, call, ret)
			case errors.Is(err, lockclient.ErrSessionExpired):
				// The session expired (a slow machine missed keepalives):
				// nothing changed; carry on with a new one.
				_ = s.Close(ctx)
				if s, err = open(); err != nil {
					return err
				}
			default:
				return err
			}
			heldAt = ret
		case rnd.IntN(8) == 0:
			// Expiry: abandon the session while holding the lock. The
			// expiry happens between now and the moment the grant log
			// shows the grant ended.
			in := lockhistory.Input{Op: lockhistory.OpExpire, Key: held.Key, Session: s.ID(), Token: held.Token}
			call := rec.now()
			s.Orphan()
			if err := waitEnded(ctx, via(), held.Token); err != nil {
				return err
			}
			rec.add(c, in, lockhistory.Output{OK: true}, call, rec.now())
			held = nil
			if s, err = open(); err != nil {
				return err
			}
		case rnd.IntN(8) == 0:
			// A keepalive racing expiry: stop renewing, then send one
			// keepalive within a few hundred milliseconds of the server's
			// expiry (before or after it) while other clients wait for
			// the key.
			s.Orphan()
			margin := s.TTL() / 10 // the client's deadline is this much before the server's expiry
			time.Sleep(time.Until(s.Deadline().Add(margin + time.Duration(rnd.IntN(600)-300)*time.Millisecond)))
			in := lockhistory.Input{Op: lockhistory.OpKeepalive, Key: held.Key, Session: s.ID(), Token: held.Token}
			rec.mu.Lock()
			rec.raced++
			rec.mu.Unlock()
			call := rec.now()
			_, err := via().KeepAlive(ctx, s.ID())
			ret := rec.now()
			switch {
			case err == nil:
				rec.add(c, in, lockhistory.Output{OK: true}, call, ret)
				if err := release(); err != nil {
					return err
				}
			case errors.Is(err, lockclient.ErrSessionExpired):
				if err := waitEnded(ctx, via(), held.Token); err != nil {
					return err
				}
				rec.add(c, lockhistory.Input{Op: lockhistory.OpExpire, Key: held.Key, Session: s.ID(), Token: held.Token}, lockhistory.Output{OK: true}, heldAt, ret)
			default:
				return err
			}
			held = nil
			_ = s.Close(ctx)
			if s, err = open(); err != nil {
				return err
			}
		default:
			if err := release(); err != nil {
				return err
			}
			held = nil
		}
	}
	if held != nil { // record the release done while shutting down
		in := lockhistory.Input{Op: lockhistory.OpRelease, Key: held.Key, Session: s.ID(), Token: held.Token}
		call := rec.now()
		err := releaseVia(ctx, via(), s.ID(), held.Key, held.Token)
		rec.add(c, in, lockhistory.Output{OK: err == nil}, call, rec.now())
		if err != nil && !errors.Is(err, lockclient.ErrNotHeld) {
			return err
		}
	}
	return nil
}

func acquireVia(ctx context.Context, cl *lockclient.Client, sid, key string, wait time.Duration) (*lockclient.GrantInfo, error) {
	hc, err := httpx.NewClient(cl.BaseURL(), executorToken, httpx.WithTimeout(wait+30*time.Second))
	if err != nil {
		return nil, err
	}
	var g lockclient.GrantInfo
	err = hc.Post(ctx, "/v1/locks/"+key+"/acquire", lockclient.AcquireRequest{SessionID: sid, WaitMS: wait.Milliseconds()}, &g)
	if err != nil {
		return nil, err
	}
	return &g, nil
}

func releaseVia(ctx context.Context, cl *lockclient.Client, sid, key string, token fencing.Token) error {
	hc, err := httpx.NewClient(cl.BaseURL(), executorToken)
	if err != nil {
		return err
	}
	return hc.Post(ctx, "/v1/locks/"+key+"/release", lockclient.ReleaseRequest{SessionID: sid, Token: token}, nil)
}

func expired(ctx context.Context, cl *lockclient.Client, token fencing.Token) bool {
	if waitEnded(ctx, cl, token) != nil {
		return false
	}
	p, err := cl.Grants(ctx, token-1, 1)
	return err == nil && len(p.Items) == 1 && *p.Items[0].EndReason == "expired"
}

func waitEnded(ctx context.Context, cl *lockclient.Client, token fencing.Token) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		p, err := cl.Grants(ctx, token-1, 1)
		if problem.Has(err, problem.Unavailable) || errors.Is(err, httpx.ErrTransport) {
			time.Sleep(50 * time.Millisecond) // the store is away: ask again
			continue
		}
		if err != nil {
			return err
		}
		if len(p.Items) == 1 && p.Items[0].Token == token && p.Items[0].EndedAt != nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("grant %d never ended", token)
}

// checkGrantLog: the log holds exactly the grants the clients saw, tokens
// strictly increase, and per key every grant but the last has ended.
func checkGrantLog(t *testing.T, kind, url string, grants int) {
	t.Helper()
	cl, _ := lockclient.New(url, lockclient.WithToken(executorToken))
	recs, err := cl.AllGrants(testCtx(t), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != grants {
		t.Fatalf("grant log has %d records, clients saw %d grants", len(recs), grants)
	}
	last := map[string]lockclient.GrantRecord{}
	var prev fencing.Token
	for _, r := range recs {
		if r.Token <= prev {
			t.Fatalf("grant log out of token order: %d after %d", r.Token, prev)
		}
		prev = r.Token
		if p, ok := last[r.Key]; ok {
			if p.EndedAt == nil {
				t.Fatalf("grant %d of %s was made while grant %d was still live", r.Token, r.Key, p.Token)
			}
			// On PostgreSQL both times are the database's clock read inside
			// the deciding statement, so they must not overlap. On etcd they
			// are the service's clock around the transaction (order is the
			// revision, i.e. the token), so only the above applies.
			if kind == "postgres" && p.EndedAt.After(r.GrantedAt) {
				t.Fatalf("grant %d of %s starts at %s, before grant %d ended at %s", r.Token, r.Key, r.GrantedAt, p.Token, p.EndedAt)
			}
		}
		last[r.Key] = r
	}
}
