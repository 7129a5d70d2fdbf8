package executor

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/lockclient"
)

// release gives back a round's grant and reports whether it is settled.
// A release with no verdict is kept for retryReleases: the session lives
// on, so the key would otherwise stay held by it for as long as this
// process runs.
func (e *Executor) release(log *slog.Logger, account string, g grant) (settled bool) {
	ctx, cancel := e.callCtx()
	defer cancel()
	err := g.Release(ctx)
	switch {
	case err == nil:
		log.Debug("lock released")
	case releaseRetryable(err):
		e.releaseLater(account, g)
		log.Warn("lock release failed; retrying on the next poll", obs.KeyError, err.Error())
		return false
	default:
		// After a loss the key is no longer ours; the release is moot.
		log.Info("lock release refused; the key is no longer ours", obs.KeyError, err.Error())
	}
	return true
}

// toRelease is a grant waiting in unreleased to be given back.
type toRelease struct {
	g grant
	// failed: a release of it already got no verdict (logged at WARN once).
	failed bool
}

// releaseLater records a grant whose release failed for a reason that may
// pass (no answer from the lock service).
func (e *Executor) releaseLater(account string, g grant) {
	e.mu.Lock()
	e.unreleased[account] = toRelease{g: g, failed: true}
	e.mu.Unlock()
}

// startReleases runs release passes (retryReleases) in the background
// until no queued grant is left untried, unless a pass is running already
// or nothing is queued. A pass waits on the lock service; the dispatch
// loop must not, since on a busy executor a kept grant's linger ends every
// few milliseconds. A release that got no verdict is tried again by the
// pass the next poll starts, not at once.
func (e *Executor) startReleases(log *slog.Logger, wg *sync.WaitGroup) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.releasing || len(e.unreleased) == 0 {
		return
	}
	e.releasing = true
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			e.retryReleases(log)
			e.mu.Lock()
			again := false
			for account, p := range e.unreleased {
				again = again || (!p.failed && !e.active[account])
			}
			e.releasing = again
			e.mu.Unlock()
			if !again {
				return
			}
		}
	}()
}

// retryReleases releases every grant in unreleased once, up to
// --concurrency at a time: those whose release failed before, and kept
// grants past their linger. A release refused as not held (the key already
// moved on) or for a gone session is done too.
//
// A release is never retried for an account a worker is on: that worker
// may have re-acquired the key, and since a re-acquire by the same session
// returns the same token, the retry would free the worker's live grant on
// the server while it carries on. Each retry reserves its account like a
// worker does, so no worker can start on it while the retry is in flight.
// It reserves it only when its turn comes: an account whose release is
// still waiting for a slot stays open to a worker, which takes the key
// over (its acquire supersedes the queued release), instead of leaving a
// payout that arrived meanwhile until the poll after the release.
func (e *Executor) retryReleases(log *slog.Logger) {
	type pending struct {
		account string
		toRelease
	}
	var todo []pending
	e.mu.Lock()
	for account, p := range e.unreleased {
		if e.active[account] {
			continue // its worker owns the key now; the worker releases it
		}
		todo = append(todo, pending{account, p})
	}
	e.mu.Unlock()
	var wg sync.WaitGroup
	slots := make(chan struct{}, max(e.cfg.Concurrency, 1))
	for _, p := range todo {
		slots <- struct{}{}
		if !e.reserveRelease(p.account, p.g) {
			<-slots
			continue
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			e.releaseQueued(log, p.account, p.toRelease)
		}()
	}
	wg.Wait()
}

// reserveRelease reserves account for the release of g, queued in
// unreleased, unless a worker is on the account or the queued release has
// changed since (a worker's acquire superseded it).
func (e *Executor) reserveRelease(account string, g grant) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p, ok := e.unreleased[account]; !ok || p.g != g || e.active[account] {
		return false
	}
	e.active[account] = true
	e.inRelease[account] = false
	return true
}

// releaseQueued releases one queued grant whose account retryReleases has
// reserved, and ends the reservation.
func (e *Executor) releaseQueued(log *slog.Logger, account string, p toRelease) {
	ctx, cancel := e.callCtx()
	err := p.g.Release(ctx)
	cancel()
	settled := err == nil || !releaseRetryable(err)
	e.mu.Lock()
	if settled {
		delete(e.unreleased, account)
	} else {
		e.unreleased[account] = toRelease{g: p.g, failed: true}
	}
	delete(e.active, account)
	asked, wake := e.inRelease[account], e.wake
	delete(e.inRelease, account)
	e.mu.Unlock()
	if asked {
		// A dispatch left the account for this release: ask for work
		// again now rather than at the next poll.
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	switch {
	case !settled && !p.failed:
		log.Warn("lock release failed; retrying on the next poll", obs.KeyKey, p.g.Key(), obs.KeyToken, int64(p.g.Token()), obs.KeyError, err.Error())
	case settled && p.failed:
		log.Info("earlier failed lock release settled", obs.KeyKey, p.g.Key(), obs.KeyToken, int64(p.g.Token()), "result", releaseResult(err))
	case settled:
		log.Debug("kept lock released", obs.KeyKey, p.g.Key(), obs.KeyToken, int64(p.g.Token()), "result", releaseResult(err))
	}
}

// releaseRetryable: the lock service gave no verdict (unreachable, 5xx).
func releaseRetryable(err error) bool {
	switch {
	case problem.Has(err, problem.NotHeld), problem.Has(err, problem.SessionExpired),
		errors.Is(err, lockclient.ErrSessionLost), problem.Has(err, problem.InvalidRequest):
		return false
	}
	return true
}

func releaseResult(err error) string {
	if err == nil {
		return "released"
	}
	return err.Error()
}

// cooldown is how long an account whose last round moved nothing waits.
type cooldown struct {
	b     backoff
	until time.Time
	// pause: until is the end of a rail pause, and the cooldown ends with
	// the pause (a rail answer ends it early).
	pause bool
}

// cooling reports whether the cooldown still holds at now; paused says
// whether claims are still paused.
func (c *cooldown) cooling(now time.Time, paused bool) bool {
	return now.Before(c.until) && (paused || !c.pause)
}

// backoff is a capped exponential backoff with jitter.
type backoff struct {
	min, max, cur time.Duration
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	return b.cur/2 + rand.N(b.cur/2+1)
}

func (b *backoff) reset() { b.cur = 0 }
