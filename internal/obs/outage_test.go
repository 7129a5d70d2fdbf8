package obs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// jsonLines returns a logger writing every level as JSON into a buffer,
// and a function reading the lines written so far.
func jsonLines(t *testing.T) (*slog.Logger, func() []map[string]any) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return log, func() []map[string]any {
		var lines []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if l == "" {
				continue
			}
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("log line %q: %v", l, err)
			}
			lines = append(lines, m)
		}
		return lines
	}
}

func count(lines []map[string]any, level, msg string) int {
	n := 0
	for _, l := range lines {
		if l["level"] == level && l["msg"] == msg {
			n++
		}
	}
	return n
}

// TestOutageLogsItsStartRemindersAndEnd: a dependency failing on every
// tick of a fast loop is one WARN line when the outage starts, a reminder
// WARN per remindEvery with how long and how many failures, DEBUG lines
// in between, and one INFO line when it answers again.
func TestOutageLogsItsStartRemindersAndEnd(t *testing.T) {
	log, lines := jsonLines(t)
	now := time.Unix(1700000000, 0)
	o := NewOutage(log)
	o.Now = func() time.Time { return now }
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
	var warns, debugs, infos []map[string]any
	for _, r := range lines() {
		switch r["level"] {
		case "WARN":
			warns = append(warns, r)
		case "DEBUG":
			debugs = append(debugs, r)
		case "INFO":
			infos = append(infos, r)
		}
	}
	if len(warns) != 4 { // the start, then at 1, 2 and 3 minutes
		t.Fatalf("%d WARN lines over 3 minutes of failures, want 4: %v", len(warns), warns)
	}
	if w := warns[0]; w[KeyError] != "connection refused" || w["store"] != "s" || w["failures"] != nil {
		t.Fatalf("first WARN line %v, want the error and the caller's attributes", w)
	}
	if w := warns[1]; w["down_for"] != "1m0s" || w["failures"] != float64(241) || w[KeyError] != "connection refused" {
		t.Fatalf("reminder %v, want down_for 1m0s, failures 241 and the error", w)
	}
	if len(debugs) != 4*190-4 {
		t.Fatalf("%d DEBUG lines, want every other failure", len(debugs))
	}
	if len(infos) != 1 || infos[0]["msg"] != "store reachable again" || infos[0]["down_for"] != "3m10s" || infos[0]["failures"] != float64(760) {
		t.Fatalf("INFO lines %v, want one saying the store was down 3m10s over 760 failures", infos)
	}
	// A new outage starts with a WARN line again.
	o.Fail(ctx, "store unreachable", errors.New("timeout"))
	if n := count(lines(), "WARN", "store unreachable"); n != 5 {
		t.Fatalf("%d WARN lines after a second outage began, want 5", n)
	}
}
