package obs

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/logtest"
)

// TestOutageLogsItsStartRemindersAndEnd: a dependency failing on every
// tick of a fast loop is one WARN line when the outage starts, a reminder
// WARN per remindEvery with how long and how many failures, DEBUG lines
// in between, and one INFO line when it answers again.
func TestOutageLogsItsStartRemindersAndEnd(t *testing.T) {
	capture, log := logtest.New()
	now := time.Unix(1700000000, 0)
	o := NewOutage(log, time.Minute)
	o.now = func() time.Time { return now }
	ctx := context.Background()
	if o.Recover(ctx, "store reachable again") {
		t.Fatal("Recover reported an outage before any failure")
	}
	// 250 ms ticks for 3 minutes and a bit.
	for i := 0; i < 4*190; i++ {
		o.Fail(ctx, "store unreachable", errors.New("connection refused"), "store", "s")
		now = now.Add(250 * time.Millisecond)
	}
	if !o.Down() {
		t.Fatal("Down is false during the outage")
	}
	if !o.Recover(ctx, "store reachable again", "store", "s") {
		t.Fatal("Recover reported no outage after failures")
	}
	if o.Down() || o.Recover(ctx, "store reachable again") {
		t.Fatal("the outage did not end at Recover")
	}
	var warns, debugs, infos []logtest.Record
	for _, r := range capture.Records() {
		switch r.Level {
		case slog.LevelWarn:
			warns = append(warns, r)
		case slog.LevelDebug:
			debugs = append(debugs, r)
		case slog.LevelInfo:
			infos = append(infos, r)
		}
	}
	if len(warns) != 4 { // the start, then at 1, 2 and 3 minutes
		t.Fatalf("%d WARN lines over 3 minutes of failures, want 4: %v", len(warns), warns)
	}
	if w := warns[0]; w.Attrs[KeyError] != "connection refused" || w.Attrs["store"] != "s" || w.Attrs["failures"] != nil {
		t.Fatalf("first WARN line %v, want the error and the caller's attributes", w)
	}
	if w := warns[1]; w.Attrs["down_for"] != "1m0s" || w.Attrs["failures"] != int64(241) || w.Attrs[KeyError] != "connection refused" {
		t.Fatalf("reminder %v, want down_for 1m0s, failures 241 and the error", w)
	}
	if len(debugs) != 4*190-4 {
		t.Fatalf("%d DEBUG lines, want every other failure", len(debugs))
	}
	if len(infos) != 1 || infos[0].Message != "store reachable again" || infos[0].Attrs["down_for"] != "3m10s" || infos[0].Attrs["failures"] != int64(760) {
		t.Fatalf("INFO lines %v, want one saying the store was down 3m10s over 760 failures", infos)
	}
	// A new outage starts with a WARN line again.
	o.Fail(ctx, "store unreachable", errors.New("timeout"))
	if n := capture.Count(logtest.Level(slog.LevelWarn), "store unreachable"); n != 5 {
		t.Fatalf("%d WARN lines after a second outage began, want 5", n)
	}
}

// With remindEvery 0 an outage is one WARN line however long it lasts.
func TestOutageWithoutReminders(t *testing.T) {
	capture, log := logtest.New()
	now := time.Unix(1700000000, 0)
	o := NewOutage(log, 0)
	o.now = func() time.Time { return now }
	for i := 0; i < 100; i++ {
		o.Fail(context.Background(), "down", errors.New("x"))
		now = now.Add(time.Minute)
	}
	if n := capture.Count(logtest.Level(slog.LevelWarn), "down"); n != 1 {
		t.Fatalf("%d WARN lines, want 1", n)
	}
}
