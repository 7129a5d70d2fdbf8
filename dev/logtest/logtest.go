// Package logtest captures what a logger writes, for tests that assert
// which lines a process logs and at which level.
package logtest

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"
)

// Record is one captured line.
type Record struct {
	Level   slog.Level
	Message string
	Attrs   map[string]any
}

// Log holds the records of the loggers New returns.
type Log struct {
	mu      sync.Mutex
	recs    []Record
	changed chan struct{} // closed and replaced at every record
}

// New returns a capture and a logger writing every level, DEBUG included,
// into it.
func New() (*Log, *slog.Logger) {
	l := &Log{changed: make(chan struct{})}
	return l, slog.New(&handler{log: l})
}

// Records returns a copy of the records so far.
func (l *Log) Records() []Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Record(nil), l.recs...)
}

// Count is how many records have message msg at level (any level when
// level is nil).
func (l *Log) Count(level *slog.Level, msg string) int {
	n := 0
	for _, r := range l.Records() {
		if r.Message == msg && (level == nil || r.Level == *level) {
			n++
		}
	}
	return n
}

// Level is a helper for Count.
func Level(l slog.Level) *slog.Level { return &l }

// WaitFor waits until cond holds over the records, up to timeout, and
// fails the test naming what it waited for if it never does. It wakes at
// every new record, so it needs no polling interval.
func (l *Log) WaitFor(t testing.TB, timeout time.Duration, what string, cond func([]Record) bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		l.mu.Lock()
		ok, changed := cond(l.recs), l.changed
		l.mu.Unlock()
		if ok {
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			t.Fatalf("waited %v for %s; logged: %v", timeout, what, l.Records())
		}
	}
}

type handler struct {
	log   *Log
	attrs []slog.Attr
}

func (h *handler) Enabled(context.Context, slog.Level) bool { return true }

func (h *handler) Handle(_ context.Context, r slog.Record) error {
	rec := Record{Level: r.Level, Message: r.Message, Attrs: map[string]any{}}
	for _, a := range h.attrs {
		rec.Attrs[a.Key] = a.Value.Resolve().Any()
	}
	r.Attrs(func(a slog.Attr) bool {
		rec.Attrs[a.Key] = a.Value.Resolve().Any()
		return true
	})
	h.log.mu.Lock()
	h.log.recs = append(h.log.recs, rec)
	close(h.log.changed)
	h.log.changed = make(chan struct{})
	h.log.mu.Unlock()
	return nil
}

func (h *handler) WithAttrs(as []slog.Attr) slog.Handler {
	return &handler{log: h.log, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

// WithGroup is not needed by the project's loggers: attributes keep their
// own keys.
func (h *handler) WithGroup(string) slog.Handler { return h }
