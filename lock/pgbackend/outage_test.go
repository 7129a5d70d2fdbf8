package pgbackend_test

import (
	"context"
	"log/slog"
	"net/url"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/faultproxy"
	"github.com/payouts/payouts/dev/logtest"
	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/pgbackend"
	"github.com/payouts/payouts/migrations"
)

// TestAnOutageOfLockdbIsLoggedOnce: while lockdb cannot be reached the
// reaper fails on every tick and the listener on every reconnection; each
// says so in one WARN line when the outage starts (the rest at DEBUG, a
// reminder at most each minute), and in one INFO line with how long it
// lasted when lockdb answers again. A WARN line per tick was ~6 lines a
// second for as long as lockdb was down.
func TestAnOutageOfLockdbIsLoggedOnce(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDB(t, migrations.LockDB)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	link, err := faultproxy.Listen("lockdb", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	u.Host = link.Addr()

	capture, log := logtest.New()
	ctx, cancel := context.WithCancel(context.Background())
	b, err := pgbackend.Open(ctx, pgbackend.Config{DatabaseURL: u.String(), Logger: log, ReapInterval: 10 * time.Millisecond})
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = b.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done; b.Close() })

	const (
		unreachable = "lock store unreachable; will retry"
		lost        = "lock notification listener lost its connection; reconnecting"
	)
	// Connections are reset, new ones refused at once, as a database
	// that was stopped.
	start := time.Now()
	if err := link.Set(faultproxy.Reset, 0); err != nil {
		t.Fatal(err)
	}
	capture.WaitFor(t, 2*time.Minute, "100 failed reaper ticks and 4 failed reconnections", func(rs []logtest.Record) bool {
		ticks, reconnects := 0, 0
		for _, r := range rs {
			switch r.Message {
			case unreachable:
				ticks++
			case lost:
				reconnects++
			}
		}
		return ticks >= 100 && reconnects >= 4
	})
	// One WARN line each when the outage started, and a reminder a minute.
	limit := 1 + int(time.Since(start)/time.Minute)
	warn := logtest.Level(slog.LevelWarn)
	for _, msg := range []string{unreachable, lost} {
		if n := capture.Count(warn, msg); n < 1 || n > limit {
			t.Errorf("%d WARN lines %q over the outage, want 1 to %d", n, msg, limit)
		}
	}
	for _, r := range capture.Records() {
		if r.Message == unreachable && r.Level == slog.LevelWarn && r.Attrs["error"] == "" {
			t.Errorf("the outage's WARN line has no error: %v", r)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	if err := link.Set(faultproxy.Pass, 0); err != nil {
		t.Fatal(err)
	}
	for _, msg := range []string{"lock store reachable again", "lock notification listener listening again"} {
		capture.WaitFor(t, 2*time.Minute, "INFO "+msg, func(rs []logtest.Record) bool {
			for _, r := range rs {
				if r.Message == msg && r.Level == slog.LevelInfo && r.Attrs["down_for"] != nil && r.Attrs["failures"] != nil {
					return true
				}
			}
			return false
		})
	}
}
