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
	acc := e.newAccount(t, 10_000)
	done := e.payOut(t, e.newPayout(t, acc, 10))
	stale := done.Token
	key := fencing.Key(acc)
	p := e.newPayout(t, acc, 10)
	g := e.grant(t, acc)
	defer e.release(t, g)
	ctx := ctxT(t)
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	if _, err := e.pay.Claim(ctx, p.ID, stale, "stale-1"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale claim: %v, want fenced_out", err)
	}
	first := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, first, reconcile.INV05, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})
	if first.SafetyEventsSeen.Payment == 0 {
		t.Fatal("the report does not say how far it read the payment resource's safety events")
	}

	second := pass(t, e.reconciler(t, reconcile.Options{SafetyEventsAfter: first.SafetyEventsSeen}, e.st.Ready.Tokens.Operator))
	mustNotFind(t, second, reconcile.CheckFencedOut, map[string]any{"key": key, "holder": "stale-1"})

	if _, err := e.pay.Claim(ctx, p.ID, stale, "stale-2"); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("second stale claim: %v, want fenced_out", err)
	}
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
	acc := e.newAccount(t, 10_000)
	done := e.payOut(t, e.newPayout(t, acc, 10))
	p := e.newPayout(t, acc, 10)
	g := e.grant(t, acc)
	defer e.release(t, g)
	ctx := ctxT(t)
	if _, err := e.pay.Claim(ctx, p.ID, g.Token, g.Holder()); err != nil {
		t.Fatal(err)
	}
	stale := uniq("stale")
	if _, err := e.pay.Claim(ctx, p.ID, done.Token, fencing.Holder(stale)); !problem.Has(err, problem.FencedOut) {
		t.Fatalf("stale claim: %v, want fenced_out", err)
	}

	logs := &lockedBuffer{}
	r := e.st.Ready
	cfg := reconcile.Config{LockURL: r.LockURL, PaymentURL: r.PaymentURL, ProxyURL: r.ProxyURL, RailURL: r.RailURL,
		Token: r.Tokens.Reconciler, RailToken: r.Tokens.Reconciler, Interval: 50 * time.Millisecond, Listen: "127.0.0.1:0",
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	exited := make(chan error, 1)
	go func() {
		_, err := reconcile.Run(runCtx, cfg)
		exited <- err
	}()
	const passes = 3
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
	if n := logs.lines("reconcile finding", stale); n != 1 {
		t.Fatalf("the fenced_out event of %s was reported by %d of at least %d passes, want 1:\n%s", stale, n, passes, logs.String())
	}
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
