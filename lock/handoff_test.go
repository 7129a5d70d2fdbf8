package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// slowFor is the real backend with every acquire by one session held back
// before it reaches the store: a waiter whose tries take that long. marked,
// if set, is told when an acquire has been marked as waiting (its first try
// failed: PostgreSQL has marked the grant contended, etcd holds the
// waiting marker).
type slowFor struct {
	backend.Backend
	sid    func() string
	delay  time.Duration
	marked chan<- struct{}
}

func (b slowFor) Waiting(ctx context.Context, key, sid string, until time.Time) func() {
	done := b.Backend.Waiting(ctx, key, sid, until)
	if b.marked != nil {
		b.marked <- struct{}{}
	}
	return done
}

func (b slowFor) Acquire(ctx context.Context, key, sid string) (backend.Grant, error) {
	if sid == b.sid() {
		t := time.NewTimer(b.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return backend.Grant{}, ctx.Err()
		}
	}
	return b.Backend.Acquire(ctx, key, sid)
}

// handOffRounds runs, once for each end (release or revoke): a holder
// session on holderURL acquires key; a session on waiterURL waits for it;
// once ready says the waiter is known where the end will look, the holder's
// grant ends and the holder at once acquires again, which must find the key
// held (the waiter's). setWaiter is told the waiter's session id; settled,
// if set, is called once the waiter has released the key.
func handOffRounds(t *testing.T, holderURL, waiterURL string, setWaiter func(string),
	ready func(ctx context.Context, holder *lockclient.Session, key string), settled func(key string), ends ...string) {
	t.Helper()
	ctx := testCtx(t)
	open := func(url, owner string) *lockclient.Session {
		s, err := lockclient.Open(ctx, url, owner, lockclient.WithToken(executorToken), lockclient.WithTTL(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
		return s
	}
	holder, waiter := open(holderURL, "executor"), open(waiterURL, "reconciler")
	setWaiter(waiter.ID())
	operator, err := lockclient.New(holderURL, lockclient.WithToken(operatorToken))
	if err != nil {
		t.Fatal(err)
	}
	key := fencing.Key("acc-handoff")
	endBy := map[string]func(g *lockclient.Grant) error{
		"release": func(g *lockclient.Grant) error { return holder.Release(ctx, g) },
		"revoke": func(g *lockclient.Grant) error {
			_, err := operator.Revoke(ctx, key, "handing the key to the reconciler")
			return err
		},
	}
	for _, end := range ends {
		g, err := holder.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("%s: holder's acquire: %v", end, err)
		}
		type result struct {
			g   *lockclient.Grant
			err error
		}
		got := make(chan result, 1)
		go func() {
			wg, err := waiter.Acquire(ctx, key, 30*time.Second)
			got <- result{wg, err}
		}()
		ready(ctx, holder, key)
		if err := endBy[end](g); err != nil {
			t.Fatalf("%s: %v", end, err)
		}
		if _, err := holder.TryAcquire(ctx, key); !errors.Is(err, lockclient.ErrLockHeld) {
			t.Fatalf("%s: the holder's acquire right after it: want ErrLockHeld (the waiter has the key), got %v", end, err)
		}
		r := <-got
		if r.err != nil {
			t.Fatalf("%s: waiter: %v", end, r.err)
		}
		if r.g.Token <= g.Token {
			t.Fatalf("%s: waiter's token %d <= %d", end, r.g.Token, g.Token)
		}
		if err := waiter.Release(ctx, r.g); err != nil {
			t.Fatal(err)
		}
		if settled != nil {
			settled(key)
		}
	}
}

// A holder whose grant ends (it releases it, or an operator revokes it) and
// that at once acquires the key again does not take it from an acquire
// waiting for it on the same process, however long the waiter's try takes
// (within a second): the release or revoke answers after the waiter it woke
// has tried. Without the hand-off the holder's acquire, sent once the end is
// answered, wins while the waiter's try is still on its way.
func TestAnEndHandsTheKeyToAWaiterBeforeItAnswers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		var waiterID atomic.Value
		sid := func() string { s, _ := waiterID.Load().(string); return s }
		svc := startServiceOn(t, slowFor{Backend: newStore(t, kind).open(t), sid: sid, delay: 200 * time.Millisecond})
		handOffRounds(t, svc.URL, svc.URL, func(id string) { waiterID.Store(id) },
			func(ctx context.Context, holder *lockclient.Session, key string) {
				eventually(t, "the waiter to be counted", func() bool {
					l, err := holder.Client().Lock(ctx, key)
					return err == nil && l.Waiters == 1
				})
			}, nil, "release", "revoke", "release")
	})
}

// The same across two lock-service processes over one store: the holder
// ends its grant on one, the waiter waits on the other. The end answers
// once the waiter, woken through the store, has taken the key.
func TestAnEndHandsTheKeyToAWaiterOnAnotherProcess(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		st := newStore(t, kind)
		holderSide := st.open(t)
		var waiterID atomic.Value
		sid := func() string { s, _ := waiterID.Load().(string); return s }
		marked := make(chan struct{}, 1)
		svcA := startServiceOn(t, holderSide)
		svcB := startServiceOn(t, slowFor{Backend: st.open(t), sid: sid, delay: 200 * time.Millisecond, marked: marked})
		handOffRounds(t, svcA.URL, svcB.URL, func(id string) { waiterID.Store(id) },
			func(ctx context.Context, holder *lockclient.Session, key string) {
				<-marked
				if eb, ok := holderSide.(*etcdbackend.Backend); ok {
					eventually(t, "the holder's process to see the waiter", func() bool { return eb.WaitingFor(key) })
				}
			}, func(key string) {
				if eb, ok := holderSide.(*etcdbackend.Backend); ok {
					eventually(t, "the waiter's marker to go", func() bool { return !eb.WaitingFor(key) })
				}
			}, "release", "revoke", "release")
	})
}
