package executor

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/obs"
)

// outage is a service's outage as the executor sees it: logged as
// obs.Outage logs one (one WARN when it starts, a reminder a minute with
// down_for and failures, DEBUG in between, one INFO when the service
// answers again: a failure on every poll or retry, each a WARN, buried
// everything else in the log), to the logger of each call; and bo, when
// set, the wait before the next try, reset when the service answers.
// Safe for concurrent use.
type outage struct {
	log obs.Outage
	mu  sync.Mutex
	bo  backoff
}

// failed records a failure, err, and logs msg with args (obs.Outage); it
// returns the wait before the next try.
func (o *outage) failed(log *slog.Logger, msg string, err error, args ...any) time.Duration {
	o.log.FailTo(context.Background(), log, msg, err, args...)
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.bo.next()
}

// answered records that the service answered; it logs msg at INFO, with
// the outage's duration and failures, when that ends an outage, and only
// then resets the backoff (every step that gets an answer calls this).
func (o *outage) answered(log *slog.Logger, msg string, args ...any) {
	if !o.log.RecoverTo(context.Background(), log, msg, args...) {
		return
	}
	o.mu.Lock()
	o.bo.reset()
	o.mu.Unlock()
}

// down reports whether an outage is going on.
func (o *outage) down() bool { return o.log.Down() }
