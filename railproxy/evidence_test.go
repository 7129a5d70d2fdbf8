//go:build !negativecontrol

package railproxy

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/safetylog"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// A reader paging the proxy's safety events by id (as the reconciler does,
// keeping the highest id seen) never skips an event whose transaction
// commits after a higher id was read. Forced interleaving: one evidence
// write holds its transaction open with the lower id while a stale
// submission records its own evidence; the reader pages in between and
// after.
func TestSafetyEventsNeverSkipALateCommit(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-1", "acc-1"), 10, holder(1)); err != nil {
		t.Fatal(err)
	}
	late, err := b.proxy.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(context.Background()) //nolint:errcheck // committed below
	if err := safetylog.Insert(ctx, late, safetylog.Event{Kind: proxyclient.KindFencedOut, Key: "payout:acc-1", Presented: 1, Holder: "late", PayoutID: "p-0", Detail: "committed late"}); err != nil {
		t.Fatal(err)
	}
	refused := make(chan error, 1)
	go func() {
		_, err := b.pc.Submit(ctx, sub("p-2", "acc-1"), 3, holder(2)) // fenced out: its evidence is written now
		refused <- err
	}()
	var done error
	deadline := time.Now().Add(90 * time.Second)
	for settled := false; !settled; {
		select {
		case done = <-refused:
			settled = true
		default:
			var waiting int
			_ = b.proxy.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting)
			settled = waiting > 0
		}
		if !settled && time.Now().After(deadline) {
			t.Fatal("timed out waiting for the refusal's evidence to commit or wait")
		}
		time.Sleep(10 * time.Millisecond)
	}
	seen := map[int64]bool{}
	cursor := ""
	read := func() {
		page, err := b.recon.SafetyEvents(ctx, cursor, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Items {
			seen[ev.ID] = true
		}
		if n := len(page.Items); n > 0 {
			cursor = page.Next
			if cursor == "" {
				cursor = wire.IDCursor(page.Items[n-1].ID)
			}
		}
	}
	read()
	if err := late.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if done == nil {
		done = <-refused
	}
	if !problem.Has(done, problem.FencedOut) {
		t.Fatalf("stale submission: %v, want fenced_out", done)
	}
	read()
	rows, err := b.proxy.pool.Query(ctx, `SELECT id FROM safety_event`)
	if err != nil {
		t.Fatal(err)
	}
	all, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 2 {
		t.Fatalf("%d safety events stored, want 2", len(all))
	}
	for _, id := range all {
		if !seen[id] {
			t.Fatalf("safety event %d was never served to a reader paging by id (served %v)", id, seen)
		}
	}
}

// A refusal whose evidence cannot be stored (here: proxydb gone between
// the refusal and its evidence) still stands, answered fenced_out, and the
// missing evidence is counted in
// payouts_proxy_safety_event_write_failures_total, which an alert reads:
// before, only a log line said so.
func TestEvidenceThatCannotBeStoredIsCounted(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-1", "acc-1"), 10, holder(1)); err != nil {
		t.Fatal(err)
	}
	lost0, fenced0 := counterValue(t, b.proxy.m.evidenceLost), counterValue(t, b.proxy.m.fencedOut)
	gone := func() { b.proxy.pool.Close() }
	b.proxy.afterRefusal.Store(&gone)
	_, err := b.pc.Submit(ctx, sub("p-2", "acc-1"), 3, holder(2))
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Code != problem.FencedOut {
		t.Fatalf("stale submission with proxydb gone after the refusal: %v, want fenced_out", err)
	}
	if d := counterValue(t, b.proxy.m.fencedOut) - fenced0; d != 1 {
		t.Errorf("fenced_out counted %v, want 1", d)
	}
	if d := counterValue(t, b.proxy.m.evidenceLost) - lost0; d != 1 {
		t.Errorf("evidence write failures counted %v, want 1", d)
	}
	if !strings.Contains(b.logs.String(), "fenced_out: submission refused, but its evidence could not be recorded") {
		t.Errorf("no log line says the evidence is missing; logs:\n%s", b.logs.String())
	}
}
