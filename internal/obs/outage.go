package obs

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// RemindEvery is how often at most an Outage repeats its WARN line while
// the outage lasts: a loop that retries every fraction of a second would
// otherwise log thousands of identical lines an hour, burying whatever
// else the process says.
const RemindEvery = time.Minute

// Outage logs a dependency that keeps failing (a database, a service) as
// one WARN line when the outage starts, with the error; a reminder WARN at
// most every RemindEvery while it lasts, with how long (down_for) and how
// many failures; and one INFO line when it ends, with how long it lasted.
// The failures in between are logged at DEBUG. Fail and Recover log to the
// logger NewOutage was given; FailTo and RecoverTo to the caller's (one
// whose attributes differ from call to call), and need no NewOutage: the
// zero Outage is ready for them. It is safe for concurrent use.
type Outage struct {
	log *slog.Logger
	// Now is the clock (nil: time.Now); tests set it.
	Now func() time.Time

	mu       sync.Mutex
	since    time.Time // first failure of the outage; zero: no outage
	warned   time.Time // last WARN line of the outage
	failures int
}

// NewOutage returns an Outage logging to log.
func NewOutage(log *slog.Logger) *Outage { return &Outage{log: log} }

func (o *Outage) now() time.Time {
	if o.Now != nil {
		return o.Now()
	}
	return time.Now()
}

// Fail records one failure, err, and logs msg with args: at WARN for the
// first failure of an outage and for a reminder, at DEBUG otherwise.
func (o *Outage) Fail(ctx context.Context, msg string, err error, args ...any) {
	o.FailTo(ctx, o.log, msg, err, args...)
}

// FailTo is Fail logging to log.
func (o *Outage) FailTo(ctx context.Context, log *slog.Logger, msg string, err error, args ...any) {
	now := o.now()
	o.mu.Lock()
	o.failures++
	level := slog.LevelDebug
	switch {
	case o.since.IsZero():
		o.since, o.warned, o.failures = now, now, 1
		level = slog.LevelWarn
	case now.Sub(o.warned) >= RemindEvery:
		o.warned = now
		level = slog.LevelWarn
	}
	down, failures := now.Sub(o.since), o.failures
	o.mu.Unlock()
	if !log.Enabled(ctx, level) {
		return
	}
	args = append(args, KeyError, errText(err))
	if failures > 1 {
		args = append(args, "down_for", down.Round(time.Millisecond).String(), "failures", failures)
	}
	log.Log(ctx, level, msg, args...)
}

// Recover ends the outage, if there is one, logging msg with args and how
// long it lasted at INFO. It reports whether there was an outage.
func (o *Outage) Recover(ctx context.Context, msg string, args ...any) bool {
	return o.RecoverTo(ctx, o.log, msg, args...)
}

// RecoverTo is Recover logging to log.
func (o *Outage) RecoverTo(ctx context.Context, log *slog.Logger, msg string, args ...any) bool {
	now := o.now()
	o.mu.Lock()
	since, failures := o.since, o.failures
	o.since, o.warned, o.failures = time.Time{}, time.Time{}, 0
	o.mu.Unlock()
	if since.IsZero() {
		return false
	}
	args = append(args, "down_for", now.Sub(since).Round(time.Millisecond).String(), "failures", failures)
	log.Log(ctx, slog.LevelInfo, msg, args...)
	return true
}

// Down reports whether an outage is under way.
func (o *Outage) Down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
