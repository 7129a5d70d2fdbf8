package payment

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/safetylog"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// A token_regression is judged from the fence that refused the request, as
// guard 1's statement returned it — not from a fence read afterwards, which
// a newer holder may have moved meanwhile (and which then hid the
// regression).
func TestTokenRegressionJudgedFromTheRefusingStatement(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	if _, err := e.exec.Claim(tctx(t), "po-1", 5, "holder-a"); err != nil {
		t.Fatal(err)
	}
	// Between the refusal and its evidence, a newer holder moves the fence.
	moved := func() {
		if _, err := e.svc.pool.Exec(context.Background(),
			`UPDATE account SET fence_token = 9, fence_holder = 'holder-c' WHERE id = 'acc-1'`); err != nil {
			t.Error(err)
		}
	}
	e.svc.afterRefusal.Store(&moved)
	_, err := e.exec.Claim(tctx(t), "po-1", 5, "holder-b") // token 5 again, from another holder
	pe := wantCode(t, err, problem.FencedOut)
	if pe.StoredToken != 5 {
		t.Errorf("fenced_out answer names stored token %d, want 5 (the fence that refused)", pe.StoredToken)
	}
	if got := e.safetyKinds(t, "po-1"); len(got) != 2 || got[0] != "fenced_out" || got[1] != "token_regression" {
		t.Fatalf("safety events %v, want [fenced_out token_regression]", got)
	}
	var stored int64
	var storedHolder string
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT stored_token, stored_holder FROM safety_event WHERE kind = 'token_regression'`).
		Scan(&stored, &storedHolder); err != nil {
		t.Fatal(err)
	}
	if stored != 5 || fencing.Holder(storedHolder) != "holder-a" {
		t.Fatalf("token_regression evidence stored (%d, %s), want (5, holder-a)", stored, storedHolder)
	}
	if n := counterValue(e.svc.m.tokenRegressions); n != 1 {
		t.Fatalf("token regression counter %v, want 1", n)
	}
}

// A reader paging safety events by id (as the reconciler does, keeping the
// highest id seen) never skips an event whose transaction commits after a
// higher id was read. Forced interleaving: one evidence write holds its
// transaction open with the lower id while a refused request records its
// own evidence; the reader pages in between and after.
func TestSafetyEventsNeverSkipALateCommit(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	if _, err := e.exec.Claim(tctx(t), "po-1", 10, "holder-a"); err != nil {
		t.Fatal(err)
	}
	ctx := tctx(t)
	late, err := e.svc.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer late.Rollback(context.Background()) //nolint:errcheck // committed below
	if err := safetylog.Insert(ctx, late, safetylog.Event{Kind: pc.KindFencedOut, Key: "payout:acc-1", Presented: 1, Holder: "late", PayoutID: "po-1", Detail: "committed late"}); err != nil {
		t.Fatal(err)
	}
	refused := make(chan error, 1)
	go func() {
		_, err := e.exec.Claim(ctx, "po-1", 3, "holder-b") // fenced out: its evidence is written now
		refused <- err
	}()
	// Until the refusal's evidence is committed, or is waiting behind the
	// open write.
	var done error
	waitFor(t, "the refusal's evidence to commit or wait", func() bool {
		select {
		case done = <-refused:
			return true
		default:
		}
		var waiting int
		_ = e.svc.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&waiting)
		return waiting > 0
	})
	seen := map[int64]bool{}
	var cursor int64
	read := func() {
		page, err := e.recon.SafetyEvents(ctx, cursor, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range page.Items {
			seen[ev.ID] = true
			cursor = max(cursor, ev.ID)
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
		t.Fatalf("stale claim: %v, want fenced_out", done)
	}
	read()
	rows, err := e.svc.pool.Query(ctx, `SELECT id FROM safety_event`)
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

// waitFor polls cond with a generous deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A rejected transition whose fence cannot be read afterwards (here: the
// database gone between the refusal and its evidence) is still a rejected
// transition: answered invalid_transition, counted, and its evidence's
// failure to be stored counted too.
func TestRejectedTransitionSurvivesAFenceItCannotRead(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 100)
	e.payout(t, "po-1", "acc-1", 500) // more than the account holds
	if p, err := e.exec.Claim(tctx(t), "po-1", 1, "h1"); err != nil || p.State != pc.Failed {
		t.Fatalf("claim: %+v %v; want FAILED (insufficient funds)", p, err)
	}
	rej0 := counterValue(e.svc.m.rejectedTransitions.WithLabelValues(string(pc.Failed), string(EvClaim)))
	fail0 := counterValue(e.svc.m.safetyWriteFailures)
	gone := func() { e.svc.pool.Close() }
	e.svc.afterRefusal.Store(&gone)
	_, err := e.exec.Claim(tctx(t), "po-1", 2, "h2")
	wantCode(t, err, problem.InvalidTransition)
	if d := counterValue(e.svc.m.rejectedTransitions.WithLabelValues(string(pc.Failed), string(EvClaim))) - rej0; d != 1 {
		t.Errorf("rejected transitions counted %v, want 1", d)
	}
	if d := counterValue(e.svc.m.safetyWriteFailures) - fail0; d != 1 {
		t.Errorf("safety evidence write failures counted %v, want 1", d)
	}
}
