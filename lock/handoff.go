package lock

import (
	"context"
	"time"

	"github.com/payouts/payouts/lock/backend"
)

// A release (or a revoke) hands its key to an acquire waiting for it on
// this process before it answers. Without that, the releasing client (an
// executor ending a kept grant, say) could acquire the key again in the
// time the woken waiter takes to try, and a waiter (an operator's cancel,
// the reconciler) could lose every such race until its wait ran out.
//
// The release marks the key before the backend frees it; every waiting
// acquire woken by a signal after the mark tries once and reports that it
// did; the release answers when one of them has, or when no waiter is left
// (one got the key, or gave up), or after handoffWait at most. A waiter on
// another lock-service process is woken by the store's watch or notify,
// after the answer: it still races the releasing client.

// handoffWait bounds how long a release waits for the waiters it woke.
const handoffWait = time.Second

// keyWaiters is what this process knows of the acquires waiting for a key.
// Its fields are guarded by Service.mu.
type keyWaiters struct {
	n       int           // acquires waiting
	epoch   uint64        // releases that asked for a hand-off so far
	tried   uint64        // the latest epoch in which a woken waiter finished a try
	changed chan struct{} // closed and replaced when n falls or tried rises
}

func (w *keyWaiters) broadcast() {
	close(w.changed)
	w.changed = make(chan struct{})
}

func (s *Service) waiting(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w := s.waiters[key]; w != nil {
		return w.n
	}
	return 0
}

// addWaiter registers an acquire waiting for key and returns its record;
// done unregisters it.
func (s *Service) addWaiter(key string) (w *keyWaiters, done func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w = s.waiters[key]
	if w == nil {
		w = &keyWaiters{changed: make(chan struct{})}
		s.waiters[key] = w
	}
	w.n++
	s.m.waiters.Inc()
	return w, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		w.n--
		if w.n == 0 {
			delete(s.waiters, key)
		}
		s.m.waiters.Dec()
		w.broadcast()
	}
}

// epochOf is the hand-off epoch a woken waiter's try starts in.
func (s *Service) epochOf(w *keyWaiters) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return w.epoch
}

// tried records that a woken waiter finished a try started in epoch e.
func (s *Service) tried(w *keyWaiters, e uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e > w.tried {
		w.tried = e
		w.broadcast()
	}
}

// handingOver runs end, which frees key (a release or a revoke), and when
// acquires wait for key on this process returns only after the hand-off.
func (s *Service) handingOver(ctx context.Context, key string, end func() (backend.GrantRecord, error)) (backend.GrantRecord, error) {
	w, e := s.markHandoff(key)
	rec, err := end()
	if err == nil && w != nil {
		s.awaitHandoff(ctx, w, e)
	}
	return rec, err
}

// markHandoff is called before a release frees key: it returns the
// waiters' record and the epoch to wait for, or nil when none wait here.
func (s *Service) markHandoff(key string) (*keyWaiters, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w := s.waiters[key]
	if w == nil {
		return nil, 0
	}
	w.epoch++
	return w, w.epoch
}

// awaitHandoff waits, at most handoffWait, until a waiter woken after the
// mark of epoch e has tried, or no waiter is left.
func (s *Service) awaitHandoff(ctx context.Context, w *keyWaiters, e uint64) {
	t := time.NewTimer(handoffWait)
	defer t.Stop()
	for {
		s.mu.Lock()
		if w.n == 0 || w.tried >= e {
			s.mu.Unlock()
			return
		}
		ch := w.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}
