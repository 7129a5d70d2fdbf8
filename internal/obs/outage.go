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
// most every remindEvery while it lasts, with how long and how many
// failures; and one INFO line when it ends, with how long it lasted. The
// failures in between are logged at DEBUG. Its zero value is not usable:
// call NewOutage. It is safe for concurrent use.
type Outage struct {
	log    *slog.Logger
	remind time.Duration
	now    func() time.Time

	mu       sync.Mutex
	since    time.Time // first failure of the outage; zero: no outage
	warned   time.Time // last WARN line of the outage
	failures int
}

// NewOutage returns an Outage logging to log. remindEvery 0 never repeats
// the WARN line: one per outage.
func NewOutage(log *slog.Logger, remindEvery time.Duration) *Outage {
	return &Outage{log: log, remind: remindEvery, now: time.Now}
}

// Fail records one failure, err, and logs msg with args: at WARN for the
// first failure of an outage and for a reminder, at DEBUG otherwise.
func (o *Outage) Fail(ctx context.Context, msg string, err error, args ...any) {
	now := o.now()
	o.mu.Lock()
	o.failures++
	level := slog.LevelDebug
	switch {
	case o.since.IsZero():
		o.since, o.warned, o.failures = now, now, 1
		level = slog.LevelWarn
	case o.remind > 0 && now.Sub(o.warned) >= o.remind:
		o.warned = now
		level = slog.LevelWarn
	}
	down, failures := now.Sub(o.since), o.failures
	o.mu.Unlock()
	if !o.log.Enabled(ctx, level) {
		return
	}
	args = append(args, KeyError, errText(err))
	if failures > 1 {
		args = append(args, "down_for", down.Round(time.Millisecond).String(), "failures", failures)
	}
	o.log.Log(ctx, level, msg, args...)
}

// Recover ends the outage, if there is one, logging msg with args and how
// long it lasted at INFO. It reports whether there was an outage.
func (o *Outage) Recover(ctx context.Context, msg string, args ...any) bool {
	now := o.now()
	o.mu.Lock()
	since, failures := o.since, o.failures
	o.since, o.warned, o.failures = time.Time{}, time.Time{}, 0
	o.mu.Unlock()
	if since.IsZero() {
		return false
	}
	args = append(args, "down_for", now.Sub(since).Round(time.Millisecond).String(), "failures", failures)
	o.log.Log(ctx, slog.LevelInfo, msg, args...)
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
