package executor

import (
	"log/slog"
	"sync"
	"time"
)

// outageReminder is how often a WARN line repeats while a service stays
// unusable: often enough that a log read from the middle of an outage shows
// it, rare enough that an outage of hours is not thousands of lines.
const outageReminder = time.Minute

// outage logs a service's outages: one WARN when one starts, a reminder at
// most every outageReminder while it lasts (with how long and how many
// failures; every other failure at debug), one INFO when the service
// answers again. A failure on every poll or retry, each a WARN, buried
// everything else in the log. bo, when set, is the wait before the next
// try, reset when the service answers. Safe for concurrent use.
type outage struct {
	mu       sync.Mutex
	bo       backoff
	since    time.Time // zero: no outage
	failures int
	reminded time.Time
}

// failed records a failure at now and logs it: msg at WARN when it starts
// an outage, msg at WARN with the outage's duration and failures when a
// reminder is due, else at debug. It returns the wait before the next try.
func (o *outage) failed(log *slog.Logger, now time.Time, msg string, args ...any) time.Duration {
	o.mu.Lock()
	first := o.since.IsZero()
	if first {
		o.since, o.failures, o.reminded = now, 0, now
	}
	o.failures++
	remind := !first && now.Sub(o.reminded) >= outageReminder
	if remind {
		o.reminded = now
	}
	since, n, wait := o.since, o.failures, o.bo.next()
	o.mu.Unlock()
	switch {
	case first:
		log.Warn(msg, args...)
	case remind:
		log.Warn(msg, append(args, "outage", now.Sub(since).Round(time.Second).String(), "failures", n)...)
	default:
		log.Debug(msg, append(args, "outage", now.Sub(since).String(), "failures", n)...)
	}
	return wait
}

// answered records that the service answered at now; it logs msg at INFO,
// with the outage's duration and failures, when that ends an outage.
func (o *outage) answered(log *slog.Logger, now time.Time, msg string, args ...any) {
	o.mu.Lock()
	since, n := o.since, o.failures
	o.since, o.failures = time.Time{}, 0
	o.bo.reset()
	o.mu.Unlock()
	if !since.IsZero() {
		log.Info(msg, append(args, "outage", now.Sub(since).Round(time.Millisecond).String(), "failures", n)...)
	}
}

// down reports whether an outage is going on.
func (o *outage) down() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return !o.since.IsZero()
}
