package executor

import (
	"errors"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/lockclient"
)

// releaseLater records a grant whose release failed for a reason that may
// pass (no answer from the lock service).
func (e *Executor) releaseLater(g grant) {
	e.mu.Lock()
	e.unreleased[g.Key()] = g
	e.mu.Unlock()
}

// retryReleases retries every failed release once; a release refused as
// not held (the key already moved on) or for a gone session is done too.
func (e *Executor) retryReleases(log *slog.Logger) {
	e.mu.Lock()
	pending := make([]grant, 0, len(e.unreleased))
	for _, g := range e.unreleased {
		pending = append(pending, g)
	}
	e.mu.Unlock()
	for _, g := range pending {
		ctx, cancel := e.callCtx()
		err := g.Release(ctx)
		cancel()
		if err != nil && releaseRetryable(err) {
			continue
		}
		e.mu.Lock()
		if e.unreleased[g.Key()] == g {
			delete(e.unreleased, g.Key())
		}
		e.mu.Unlock()
		log.Info("earlier failed lock release settled", obs.KeyKey, g.Key(), obs.KeyToken, int64(g.Token()), "result", releaseResult(err))
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

// cooldown is how long an account that was fenced out waits.
type cooldown struct {
	b     backoff
	until time.Time
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
