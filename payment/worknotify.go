package payment

import (
	"context"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payouts/payouts/internal/obs"
)

// Payment-resource processes sharing a paydb tell one another of new work
// (payouts created, or made actionable again by a resolution), so a call
// waiting for work on one (workwait.go) is answered when the work comes
// through another: after each create batch or such resolution a process
// announces on workChannel (NOTIFY, outside the change's transaction,
// once it has committed), and each process listens there (listenForWork)
// and wakes its waiting calls.

// workChannel is the PostgreSQL notification channel of the announcements.
const workChannel = "payouts_work"

// announceEvery spaces the announcements: at most one per this interval,
// however fast payouts are created (one notifying transaction each, and
// PostgreSQL commits notifying transactions one at a time).
const announceEvery = 10 * time.Millisecond

// listenRetry is the wait before listening again after the listening
// connection failed.
const listenRetry = time.Second

// announcer runs at most one announcement at a time and coalesces the
// creates that come meanwhile into the next one.
type announcer struct {
	// pool is paydb's pool, as New opened it; the announcements and the
	// listening connection use it, off every request's path.
	pool    *pgxpool.Pool
	mu      sync.Mutex
	running bool
	pending bool
	wg      sync.WaitGroup
	// failing logs the announcements that fail while paydb is down once
	// per outage, not once per create.
	failing *obs.Outage
}

// workArrived wakes the calls waiting for work, in this process and, by
// announceWork, in the others on this paydb: payouts were created, or made
// actionable again, and the change has committed.
func (s *Service) workArrived() {
	s.workCreated.broadcast()
	s.announceWork()
}

// announceWork tells the other processes on this paydb that there is new
// work. It does not wait.
func (s *Service) announceWork() {
	a := &s.announce
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.running {
		a.pending = true
		return
	}
	a.running = true
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
			_, err := a.pool.Exec(ctx, `SELECT pg_notify('`+workChannel+`', '')`)
			cancel()
			if err != nil {
				a.failing.Fail(ctx, "could not announce new work to the other payment-resource processes; their executors see it at their next poll", err)
			} else {
				a.failing.Recover(ctx, "announcing new work to the other payment-resource processes again")
			}
			time.Sleep(announceEvery)
			a.mu.Lock()
			if !a.pending {
				a.running = false
				a.mu.Unlock()
				return
			}
			a.pending = false
			a.mu.Unlock()
		}
	}()
}

// listenForWork wakes the calls waiting for work whenever any process on
// this paydb announces created payouts, until ctx ends. A failed listening
// connection is replaced after listenRetry; meanwhile, and for what was
// announced while nobody listened, waiting calls are answered when their
// wait ends, as a poll would be.
func (s *Service) listenForWork(ctx context.Context) error {
	// Tried again every listenRetry while paydb is down: logged once per
	// outage (and a reminder now and then), not per attempt.
	failing := obs.NewOutage(s.log)
	for {
		err := s.listenOnce(ctx, failing)
		if ctx.Err() != nil {
			return nil
		}
		failing.Fail(ctx, "listening for created payouts failed; listening again shortly", err, "retry_in", listenRetry.String())
		t := time.NewTimer(listenRetry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// listenOnce listens until its connection fails; failing learns when it
// listens again after an outage.
func (s *Service) listenOnce(ctx context.Context, failing *obs.Outage) error {
	pc, err := s.announce.pool.Acquire(ctx)
	if err != nil {
		return err
	}
	// The connection stays in LISTEN state: it never goes back to the pool.
	conn := pc.Hijack()
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `LISTEN `+workChannel); err != nil {
		return err
	}
	failing.Recover(ctx, "listening for created payouts again")
	// Whatever was created before LISTEN took effect is found by the
	// waiting calls' own next look.
	s.workCreated.broadcast()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return err
		}
		s.workCreated.broadcast()
	}
}
