package lock

import (
	"context"
	"time"

	"github.com/payouts/payouts/lock/backend"
)

// A release (or a revoke) hands its key to an acquire waiting for it
// before it answers. Without that, the releasing client (an executor ending
// a kept grant, say) could acquire the key again in the time the woken
// waiter takes to try, and a waiter (an operator's cancel, the reconciler)
// could lose every such race until its wait ran out.
//
// A waiter on this process: the release marks the key before the backend
// frees it; every waiting acquire woken by a signal after the mark tries
// and reports whom it found holding the key; the release answers when a try
// found someone other than the ended grant's session (a try that found that
// session started before the end: a late signal of an earlier end), or when
// no waiter is left (one got the key, or gave up).
//
// A waiter on another process: a waiting acquire tells the store
// (Backend.Waiting), and the end of the grant reports it (Waited); the
// release then asks the store until the key is held again, the waiter
// having been woken through the store (etcd's watch, PostgreSQL's notify).
//
// Either wait lasts handoffWait at most: a waiter that has just given up,
// or a store too slow to answer, delays the release's answer by that much.

// handoffWait bounds how long a release waits for the waiters it woke;
// handoffPoll is how often it asks the store whether a waiter on another
// process has taken the key.
const (
	handoffWait = time.Second
	handoffPoll = 5 * time.Millisecond
)

// keyWaiters is what this process knows of the acquires waiting for a key.
// Its fields are guarded by Service.mu.
type keyWaiters struct {
	n       int           // acquires waiting
	epoch   uint64        // releases that asked for a hand-off so far
	tries   []try         // the latest tries woken waiters finished that failed (at most maxTries)
	changed chan struct{} // closed and replaced when n falls or a try is added
}

// try is a woken waiter's try that found the key held: the hand-off epoch
// it started in and the session it found holding the key ("" if unknown).
type try struct {
	epoch  uint64
	heldBy string
}

const maxTries = 16

// triedSince reports whether a try started in epoch e or later found the
// key held by a session other than ended: one that found the ended grant's
// session had started before that grant ended.
func (w *keyWaiters) triedSince(e uint64, ended string) bool {
	for _, t := range w.tries {
		if t.epoch >= e && t.heldBy != ended {
			return true
		}
	}
	return false
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

// tried records that a woken waiter's try started in epoch e found the key
// held by session heldBy.
func (s *Service) tried(w *keyWaiters, e uint64, heldBy string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(w.tries) == maxTries {
		w.tries = append(w.tries[:0], w.tries[1:]...)
	}
	w.tries = append(w.tries, try{e, heldBy})
	w.broadcast()
}

// handingOver runs end, which frees key (a release or a revoke), and when
// acquires wait for key on this process returns only after the hand-off.
func (s *Service) handingOver(ctx context.Context, key string, end func() (backend.GrantRecord, error)) (backend.GrantRecord, error) {
	w, e := s.markHandoff(key)
	rec, err := end()
	switch {
	case err != nil:
	case w != nil:
		s.awaitHandoff(ctx, w, e, rec.SessionID)
	case rec.Waited:
		s.awaitTaken(ctx, key)
	}
	return rec, err
}

// awaitTaken waits, at most handoffWait, until key is held again: by an
// acquire that waited for it on another process and was woken through the
// store (the releasing client, still waiting for its answer, cannot have
// taken it). It asks the store every handoffPoll.
func (s *Service) awaitTaken(ctx context.Context, key string) {
	ctx, cancel := context.WithTimeout(ctx, handoffWait)
	defer cancel()
	t := time.NewTicker(handoffPoll)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-ctx.Done():
			s.m.handoffs.WithLabelValues("timed_out").Inc()
			return
		}
		l, err := s.b.Lock(ctx, key)
		switch {
		case err == nil && l.Held:
			s.m.handoffs.WithLabelValues("remote").Inc()
			return
		case err != nil && ctx.Err() == nil:
			s.m.handoffs.WithLabelValues("timed_out").Inc()
			return // the store does not answer: do not keep asking
		}
	}
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
// mark of epoch e has tried after the grant of session ended ended, or no
// waiter is left.
func (s *Service) awaitHandoff(ctx context.Context, w *keyWaiters, e uint64, ended string) {
	t := time.NewTimer(handoffWait)
	defer t.Stop()
	for {
		s.mu.Lock()
		if w.n == 0 || w.triedSince(e, ended) {
			s.mu.Unlock()
			s.m.handoffs.WithLabelValues("local").Inc()
			return
		}
		ch := w.changed
		s.mu.Unlock()
		select {
		case <-ch:
		case <-t.C:
			s.m.handoffs.WithLabelValues("timed_out").Inc()
			return
		case <-ctx.Done():
			s.m.handoffs.WithLabelValues("timed_out").Inc()
			return
		}
	}
}
