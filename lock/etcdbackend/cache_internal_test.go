package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestEndedHereOnlyForThisProcessesDeletion: the watch skips its read of a
// deleted lock key's open marker only when this process's own transaction
// deleted that grant's key at exactly that revision; a failed or errored
// end, another revision, or a grant this process never ended all leave the
// deletion to the read (and the expiry write when the marker was there).
func TestEndedHereOnlyForThisProcessesDeletion(t *testing.T) {
	var c cache
	ctx := context.Background()
	endedHere := func(token, rev int64) bool { return c.endedHere(ctx, token, rev, time.Now().Add(time.Minute)) }
	if endedHere(7, 70) {
		t.Error("a grant this process never ended counted as ended here")
	}
	c.beginEnd(8)(0) // the end failed its compare, or erred
	if endedHere(8, 80) {
		t.Error("a failed end counted as the deletion")
	}
	c.beginEnd(9)(90)
	if endedHere(9, 91) {
		t.Error("an end at revision 90 counted as the deletion at 91")
	}
	c.beginEnd(10)(100)
	if !endedHere(10, 100) {
		t.Error("this process's end at revision 100 not recognised")
	}
	if endedHere(10, 100) {
		t.Error("an entry answered twice; it is consumed by the deletion it names")
	}

	// The watch can see the deletion before the end's caller has its
	// answer: it waits for that answer.
	answer := c.beginEnd(11)
	got := make(chan bool)
	go func() { got <- endedHere(11, 110) }()
	select {
	case v := <-got:
		t.Fatalf("endedHere answered %v before the end did", v)
	case <-time.After(50 * time.Millisecond):
	}
	answer(110)
	if !<-got {
		t.Error("an end answered while the watch waited not recognised")
	}

	// A second end of one grant while the first is in flight is not
	// registered: the first's outcome decides.
	first := c.beginEnd(12)
	c.beginEnd(12)(120)
	first(0)
	if endedHere(12, 120) {
		t.Error("the unregistered second end counted")
	}
}

// TestEndedHereWaitsNoLongerThanItsDeadline: an end whose answer never
// comes (a reply lost, or held until its caller's deadline) costs the
// watch at most the deadline it was given for its whole answer, or less
// when the watch is stopped; the deletion is then read as any other. The
// deadline decides, not a fixed wait: under a long one, an answer that
// comes later than endingWait is still waited for and recognised.
func TestEndedHereWaitsNoLongerThanItsDeadline(t *testing.T) {
	var c cache
	// bound is far beyond any deadline given below but the long one: a
	// call that ends within it was ended by its deadline or the watch's
	// end, where an answer that never comes would hold it for ever.
	const bound = 30 * time.Second
	within := func(what string, fn func() bool) {
		t.Helper()
		got := make(chan bool, 1)
		go func() { got <- fn() }()
		select {
		case v := <-got:
			if v {
				t.Errorf("%s: an end that never answered counted as the deletion", what)
			}
		case <-time.After(bound):
			t.Errorf("%s: still waiting after %s for an end that never answers", what, bound)
		}
	}
	c.beginEnd(1)
	within("a 50ms deadline", func() bool {
		return c.endedHere(context.Background(), 1, 10, time.Now().Add(50*time.Millisecond))
	})
	c.beginEnd(2)
	within("a deadline already passed", func() bool {
		return c.endedHere(context.Background(), 2, 20, time.Now().Add(-time.Second))
	})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	c.beginEnd(3)
	within("the watch stopped", func() bool {
		return c.endedHere(ctx, 3, 30, time.Now().Add(time.Hour))
	})

	// Under a long deadline the wait lasts until the answer, even one that
	// comes after twice endingWait: no fixed wait cuts it short.
	answer := c.beginEnd(4)
	got := make(chan bool, 1)
	go func() { got <- c.endedHere(context.Background(), 4, 40, time.Now().Add(time.Hour)) }()
	select {
	case v := <-got:
		t.Fatalf("endedHere answered %v after less than %s under an hour's deadline, before the end did", v, 2*endingWait)
	case <-time.After(2 * endingWait):
	}
	answer(40)
	select {
	case v := <-got:
		if !v {
			t.Error("an end answered late under a long deadline not recognised")
		}
	case <-time.After(bound):
		t.Fatalf("endedHere still waiting %s after the end answered", bound)
	}
}

// TestInBatchesHalvesWhatEtcdRefuses: every item is handled exactly once,
// in batches of at most the size given, and a batch etcd refuses as too
// large is split until it fits; any other error stops the batches and is
// returned.
func TestInBatchesHalvesWhatEtcdRefuses(t *testing.T) {
	xs := make([]expiring, 200)
	for i := range xs {
		xs[i].token = int64(i)
	}
	for _, fits := range []int{1000, 64, 10, 1} {
		t.Run(fmt.Sprint(fits), func(t *testing.T) {
			seen := map[int64]int{}
			largest := 0
			err := inBatches(xs, expiryBatch, func(batch []expiring) error {
				if len(batch) > fits {
					return fmt.Errorf("txn: %w", rpctypes.ErrTooManyOps)
				}
				largest = max(largest, len(batch))
				for _, x := range batch {
					seen[x.token]++
				}
				return nil
			})
			if err != nil {
				t.Errorf("inBatches: %v", err)
			}
			if len(seen) != len(xs) {
				t.Errorf("%d of %d items handled", len(seen), len(xs))
			}
			for tok, n := range seen {
				if n != 1 {
					t.Errorf("item %d handled %d times", tok, n)
				}
			}
			if largest > min(fits, expiryBatch) {
				t.Errorf("a batch of %d; want at most %d", largest, min(fits, expiryBatch))
			}
		})
	}
	failure := errors.New("any other error")
	calls := 0
	err := inBatches(xs, 10, func([]expiring) error {
		calls++
		if calls == 2 {
			return failure
		}
		return nil
	})
	if !errors.Is(err, failure) || calls != 2 {
		t.Errorf("a batch failing otherwise: %v after %d batches; want that error, after the second", err, calls)
	}
}

// TestEndsAreBounded: ends the watch never asks about (it was down, or the
// key was not deleted) are pruned once they are a minute old.
func TestEndsAreBounded(t *testing.T) {
	var c cache
	for i := range int64(cacheMinPrune - 1) {
		c.beginEnd(i)(i + 1)
	}
	c.mu.Lock()
	for _, e := range c.ends {
		e.begun = e.begun.Add(-2 * time.Minute)
	}
	c.mu.Unlock()
	c.beginEnd(cacheMinPrune)(cacheMinPrune + 1)
	c.mu.Lock()
	n := len(c.ends)
	c.mu.Unlock()
	if n != 1 {
		t.Errorf("%d ends kept after pruning; want 1 (the fresh one)", n)
	}
}
