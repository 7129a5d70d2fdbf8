package lock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// slowFor is the real backend with every acquire by one session held back
// before it reaches the store: a waiter whose tries take that long.
type slowFor struct {
	backend.Backend
	sid   func() string
	delay time.Duration
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

// A holder that releases a key and at once acquires it again does not take
// it from an acquire waiting for it on the same process, however long the
// waiter's try takes (within a second): the release answers after the waiter
// it woke has tried. Without the hand-off the holder's acquire, sent once the
// release is answered, wins while the waiter's try is still on its way.
func TestReleaseHandsTheKeyToAWaiterBeforeItAnswers(t *testing.T) {
	forEachBackend(t, func(t *testing.T, kind string) {
		var waiterID atomic.Value
		sid := func() string { s, _ := waiterID.Load().(string); return s }
		b := slowFor{Backend: newStore(t, kind).open(t), sid: sid, delay: 200 * time.Millisecond}
		svc := startServiceOn(t, b)
		ctx := testCtx(t)
		open := func(owner string) *lockclient.Session {
			s, err := lockclient.Open(ctx, svc.URL, owner, lockclient.WithToken(executorToken), lockclient.WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close(context.Background()) })
			return s
		}
		holder, waiter := open("executor"), open("operator")
		waiterID.Store(waiter.ID())
		key := fencing.Key("acc-handoff")
		for round := range 3 {
			g, err := holder.TryAcquire(ctx, key)
			if err != nil {
				t.Fatalf("round %d: holder's acquire: %v", round, err)
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
			eventually(t, "the waiter to be counted", func() bool {
				l, err := holder.Client().Lock(ctx, key)
				return err == nil && l.Waiters == 1
			})
			if err := holder.Release(ctx, g); err != nil {
				t.Fatalf("round %d: release: %v", round, err)
			}
			if _, err := holder.TryAcquire(ctx, key); !errors.Is(err, lockclient.ErrLockHeld) {
				t.Fatalf("round %d: the holder's acquire right after its release: want ErrLockHeld (the waiter has the key), got %v", round, err)
			}
			r := <-got
			if r.err != nil {
				t.Fatalf("round %d: waiter: %v", round, r.err)
			}
			if r.g.Token <= g.Token {
				t.Fatalf("round %d: waiter's token %d <= %d", round, r.g.Token, g.Token)
			}
			if err := waiter.Release(ctx, r.g); err != nil {
				t.Fatal(err)
			}
		}
	})
}
