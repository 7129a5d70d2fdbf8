package reconcile_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/railproxy/proxyclient"
	"github.com/payouts/payouts/reconcile"
)

func TestStateFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "state.json")
	st, err := reconcile.LoadState(path)
	if err != nil || st != (reconcile.State{}) {
		t.Fatalf("missing file: %+v, %v; want the zero state", st, err)
	}
	want := reconcile.State{SafetyEventsAfter: reconcile.EventCursor{Payment: 7, Proxy: 3}}
	if err := reconcile.SaveState(path, want); err != nil {
		t.Fatal(err)
	}
	if got, err := reconcile.LoadState(path); err != nil || got != want {
		t.Fatalf("round trip: %+v, %v; want %+v", got, err, want)
	}
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := reconcile.LoadState(path); err == nil {
		t.Fatal("a corrupt state file was accepted")
	}
}

// TestSafetyEventsReportedOncePerCursor: with the cursor of the previous
// pass, an event already reported is not reported again, and a new one is.
func TestSafetyEventsReportedOncePerCursor(t *testing.T) {
	e := setup(t)
	acc, fencedOut := e.staleClaimer(t)
	key := fencing.Key(acc)
	fencedOut("stale-1")
	first := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, first, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})
	if first.SafetyEventsSeen.Payment == 0 {
		t.Fatal("the report does not say how far it read the payment resource's safety events")
	}

	second := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: first.SafetyEventsSeen}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, second, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})

	fencedOut("stale-2")
	third := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: second.SafetyEventsSeen}, e.st.Ready.Tokens.Operator))
	mustFind(t, third, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-2"})
	mustNotFind(t, third, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})
}

// TestContinuousReportsEachSafetyEventOnce: a reconciler running without
// --state-file reports a safety event in its first pass and not in the
// passes after it (it would otherwise hold payouts_reconcile_findings up,
// and PayoutsFencedOut firing, for as long as it runs).
func TestContinuousReportsEachSafetyEventOnce(t *testing.T) {
	e := setup(t)
	_, fencedOut := e.staleClaimer(t)
	stale := uniq("stale")
	fencedOut(stale)
	ctx := ctxT(t)

	const passes = 3
	logs := e.runContinuous(t, ctx, passes, func(*reconcile.Config) {})
	if n := logs.lines("reconcile finding", stale); n != 1 {
		t.Fatalf("the fenced_out event of %s was reported by %d of at least %d passes, want 1:\n%s", stale, n, passes, logs.String())
	}
}

// TestContinuousHoldsTheStateWhileItsMetricsFileCannotBeWritten: a
// continuous reconciler whose --metrics-file cannot be written does not
// move its state on (file or memory): the safety events of a pass whose
// metrics did not reach the file are reported again by the next pass, as
// --once does, instead of never reaching the file the alerts read.
func TestContinuousHoldsTheStateWhileItsMetricsFileCannotBeWritten(t *testing.T) {
	e := setup(t)
	_, fencedOut := e.staleClaimer(t)
	stale := uniq("stale")
	fencedOut(stale)
	ctx := ctxT(t)
	dir := t.TempDir()
	blocked := filepath.Join(dir, "blocked.prom")
	if err := os.Mkdir(blocked, 0o755); err != nil { // a directory: every write of the file fails
		t.Fatal(err)
	}
	state := filepath.Join(dir, "state.json")

	const passes = 3
	logs := e.runContinuous(t, ctx, passes, func(c *reconcile.Config) { c.MetricsFile, c.StateFile = blocked, state })
	if n := logs.lines("reconcile finding", stale); n < passes {
		t.Errorf("the fenced_out event of %s was reported by %d passes of at least %d whose metrics file could not be written; want every one", stale, n, passes)
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		b, _ := os.ReadFile(state)
		t.Errorf("the state file was written although no metrics file was: %v %s", err, b)
	}
}

// runContinuous runs a continuous reconciler (a pass every 50 ms; set
// adjusts its configuration) until it has logged passes passes, stops it
// and returns its log.
func (e *testBundle) runContinuous(t *testing.T, ctx context.Context, passes int, set func(*reconcile.Config)) *lockedBuffer {
	t.Helper()
	logs := &lockedBuffer{}
	r := e.st.Ready
	cfg := reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL, RailURL: r.RailURL,
		Token: r.Tokens.Reconciler, RailToken: r.Tokens.Reconciler, Interval: 50 * time.Millisecond, Listen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	set(&cfg)
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	exited := make(chan error, 1)
	go func() {
		_, err := reconcile.Run(runCtx, cfg)
		exited <- err
	}()
	for logs.lines("reconciliation pass done") < passes {
		select {
		case err := <-exited:
			t.Fatalf("the reconciler stopped: %v\n%s", err, logs.String())
		case <-ctx.Done():
			t.Fatalf("fewer than %d passes in time:\n%s", passes, logs.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	stop()
	if err := <-exited; err != nil {
		t.Fatalf("the reconciler: %v", err)
	}
	return logs
}

// lockedBuffer collects log output written from another goroutine.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// lines counts the lines that contain every one of parts.
func (b *lockedBuffer) lines(parts ...string) int {
	n := 0
	for line := range strings.Lines(b.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// TestSafetyEventsOfARewoundLogAreReported: a guard's database restored
// from a backup (or failed over to a replica behind it) gives the ids after
// the backup to new events again. A pass with the previous pass's cursor
// notices that the event its cursor names is gone or is another one, and
// reads that guard's log from the start. Before, every new event with an id
// at or below the cursor was never reported.
func TestSafetyEventsOfARewoundLogAreReported(t *testing.T) {
	e := startStack(t, time.Second) // its own: the test rewinds paydb's log
	_, fencedOut := e.staleClaimer(t)
	fencedOut("before-backup")
	fencedOut("lost-in-restore")
	first := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, first, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"holder": "lost-in-restore"})
	cur := first.SafetyEventsSeen
	if cur.Payment < 2 || cur.PaymentAt.IsZero() {
		t.Fatalf("cursor %+v: want the last event's id and time", cur)
	}
	// The state file keeps the event's time.
	path := filepath.Join(t.TempDir(), "state.json")
	if err := reconcile.SaveState(path, reconcile.State{SafetyEventsAfter: cur}); err != nil {
		t.Fatal(err)
	}
	if st, err := reconcile.LoadState(path); err != nil || !st.SafetyEventsAfter.PaymentAt.Equal(cur.PaymentAt) || st.SafetyEventsAfter.Payment != cur.Payment {
		t.Fatalf("state file: %+v, %v; want %+v", st, err, cur)
	}

	// paydb as restored from a backup taken between the two events: the
	// last one and the sequence's advance past it are gone.
	e.exec(t, "paydb", true, `DELETE FROM safety_event WHERE id >= $1`, cur.Payment)
	e.exec(t, "paydb", false, `SELECT setval(pg_get_serial_sequence('safety_event', 'id'), $1, false)`, cur.Payment)

	missing := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: cur}, e.st.Ready.Tokens.Operator))
	if !hasNote(missing, "no longer holds event") {
		t.Fatalf("notes %q: want the rewound log named", missing.Notes)
	}
	mustFind(t, missing, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"holder": "before-backup"})
	if missing.SafetyEventsSeen.Payment != cur.Payment-1 {
		t.Fatalf("cursor after the rewind: %+v, want payment %d", missing.SafetyEventsSeen, cur.Payment-1)
	}

	// A new event takes the lost one's id; the old cursor still names it.
	fencedOut("after-restore")
	reused := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: cur}, e.st.Ready.Tokens.Operator))
	f := mustFind(t, reused, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"holder": "after-restore"})
	if id, _ := f.Objects["event_id"].(int64); id != cur.Payment {
		t.Fatalf("the new event's id is %v, want %d, the lost one's", f.Objects["event_id"], cur.Payment)
	}
	if !hasNote(reused, "gives old ids to new events") {
		t.Fatalf("notes %q: want the reused id named", reused.Notes)
	}
	// And the pass after it, with its cursor, is quiet again.
	quiet := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: reused.SafetyEventsSeen}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, quiet, reconcile.CheckFencedOut, map[string]any{"holder": "after-restore"})
	if hasNote(quiet, "read again from the start") {
		t.Fatalf("notes %q: a log that was not rewound reported as rewound", quiet.Notes)
	}
	// A cursor from a state file written before the event's time was kept
	// gets it from its first pass, with no new event to read.
	old := reconcile.EventCursor{Payment: quiet.SafetyEventsSeen.Payment}
	upgraded := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: old}, e.st.Ready.Tokens.Operator))
	if got := upgraded.SafetyEventsSeen; got.Payment != old.Payment || !got.PaymentAt.Equal(quiet.SafetyEventsSeen.PaymentAt) {
		t.Fatalf("cursor after a pass from an id alone: %+v, want id %d at %s", got, old.Payment, quiet.SafetyEventsSeen.PaymentAt)
	}
}

func hasNote(rep *reconcile.Report, s string) bool {
	for _, n := range rep.Notes {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// staleClaimer sets up an account whose fence has moved past a paid
// payout's token: a second payout claimed under a live grant (released at
// the test's end). fencedOut makes one stale claim of it as holder, which
// the payment resource fences out and records.
func (e *testBundle) staleClaimer(t *testing.T) (account string, fencedOut func(holder string)) {
	t.Helper()
	acc := e.newAccount(t, 10_000)
	done := e.payOut(t, e.newPayout(t, acc, 10))
	p := e.newPayout(t, acc, 10)
	g := e.grant(t, acc)
	t.Cleanup(func() { e.release(t, g) })
	if _, err := e.pay.Claim(ctxT(t), p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	return acc, func(holder string) {
		t.Helper()
		if _, err := e.pay.Claim(ctxT(t), p.ID, done.Token, fencing.Holder(holder)); !problem.Has(err, problem.FencedOut) {
			t.Fatalf("stale claim as %s: %v, want fenced_out", holder, err)
		}
	}
}

// TestProxySafetyEventsOfARewoundLogAreReported: the same for the rail
// proxy's log (proxydb restored from a backup): its cursor is checked
// against the proxy's events, and a new event under the lost one's id is
// reported.
func TestProxySafetyEventsOfARewoundLogAreReported(t *testing.T) {
	e := startStack(t, time.Second) // its own: the test rewinds proxydb's log
	acc := e.newAccount(t, 10_000)
	older := e.payOut(t, e.newPayout(t, acc, 10))
	e.payOut(t, e.newPayout(t, acc, 10)) // the proxy's high-water moves past older's token
	fencedOut := func(holder string) {
		t.Helper()
		p := e.newPayout(t, acc, 10)
		_, err := e.proxy.Submit(ctxT(t), proxyclient.Submission{PayoutID: p.ID, AccountID: acc, ClientRef: p.ClientRef,
			Amount: p.Amount, Currency: p.Currency, BeneficiaryRef: p.BeneficiaryRef}, older.Token, fencing.Holder(holder))
		if !problem.Has(err, problem.FencedOut) {
			t.Fatalf("stale submission as %s: %v, want fenced_out", holder, err)
		}
	}
	fencedOut("proxy-before-backup")
	fencedOut("proxy-lost-in-restore")
	first := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	cur := first.SafetyEventsSeen
	if cur.Proxy < 2 || cur.ProxyAt.IsZero() {
		t.Fatalf("cursor %+v: want the proxy's last event's id and time", cur)
	}
	e.exec(t, "proxydb", true, `DELETE FROM safety_event WHERE id >= $1`, cur.Proxy)
	e.exec(t, "proxydb", false, `SELECT setval(pg_get_serial_sequence('safety_event', 'id'), $1, false)`, cur.Proxy)
	fencedOut("proxy-after-restore")
	rep := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: cur}, e.st.Ready.Tokens.Operator))
	f := mustFind(t, rep, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"guard": "proxy", "holder": "proxy-after-restore"})
	if id, _ := f.Objects["event_id"].(int64); id != cur.Proxy {
		t.Fatalf("the new event's id is %v, want %d, the lost one's", f.Objects["event_id"], cur.Proxy)
	}
	if !hasNote(rep, "the rail proxy's safety event") {
		t.Fatalf("notes %q: want the rail proxy's rewound log named", rep.Notes)
	}
	mustNotFind(t, rep, reconcile.CheckFencedOut, map[string]any{"guard": "payment"})
}
