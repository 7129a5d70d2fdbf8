package payment

import (
	"context"
	"net/url"
	"strconv"
	"sync"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// A GET /v1/work that finds no work may wait for some (wait_ms): an idle
// executor then learns of a new payout when it is created, instead of at
// its next poll (1 s by default), and asks once per wait instead of once
// per poll interval.

// workSignal wakes the calls waiting for work when a payout is created,
// through this process or, announced (worknotify.go), through another over
// the same paydb.
type workSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

// subscribe returns a channel closed by the next broadcast.
func (w *workSignal) subscribe() <-chan struct{} {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

// broadcast wakes every subscriber since the last broadcast.
func (w *workSignal) broadcast() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// waitParam reads ?wait_ms=: 0 (the default) to MaxWorkWait.
func waitParam(q url.Values) (time.Duration, error) {
	ms, err := countParam(q, "wait_ms", int(pc.MaxWorkWait.Milliseconds()))
	return time.Duration(ms) * time.Millisecond, err
}

// payoutsParam reads ?payouts=: 0 (the default) to MaxWorkPayouts.
func payoutsParam(q url.Values) (int, error) { return countParam(q, "payouts", pc.MaxWorkPayouts) }

// countParam reads query parameter name: an integer from 0 (the default)
// to maxN.
func countParam(q url.Values, name string, maxN int) (int, error) {
	v := q.Get(name)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > maxN {
		return 0, badField(name, "must be an integer from 0 to %d, got %q", maxN, v)
	}
	return n, nil
}

// WaitForWork is Work that, when it finds no work, waits up to wait for
// new work (a payout created or made actionable again: workSignal) and
// asks again, until some work is
// listed or the wait ends (then it asks a last time). It answers a second
// before ctx's deadline at the latest, and with no work when ctx ends or
// the service stops.
func (s *Service) WaitForWork(ctx context.Context, limit int, skip []string, payouts int, wait time.Duration) ([]pc.WorkItem, error) {
	if wait <= 0 {
		return s.Work(ctx, limit, skip, payouts)
	}
	end := time.Now().Add(wait)
	if dl, ok := ctx.Deadline(); ok && dl.Add(-time.Second).Before(end) {
		end = dl.Add(-time.Second)
	}
	t := time.NewTimer(time.Until(end))
	defer t.Stop()
	last := false
	for {
		// Subscribed before asking: a payout created after the question
		// was asked wakes this call.
		woken := s.workCreated.subscribe()
		items, err := s.Work(ctx, limit, skip, payouts)
		if err != nil || len(items) > 0 || last {
			return items, err
		}
		if f := s.onWorkWait.Load(); f != nil {
			(*f)()
		}
		s.m.workWaits.Inc()
		select {
		case <-woken:
		case <-t.C:
			last = true
		case <-ctx.Done():
			return items, nil
		case <-s.stopped.Done():
			return items, nil
		}
	}
}
