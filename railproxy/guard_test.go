//go:build !negativecontrol

package railproxy

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// 20 submissions of one payout race with distinct tokens: exactly one is
// forwarded and the rail holds exactly one payment.
func TestConcurrentSubmissionsForwardExactlyOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	s := sub("p-race", "acc-race")

	const n = 20
	type result struct {
		token fencing.Token
		rec   proxyclient.Record
		err   error
	}
	results := make(chan result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 1; i <= n; i++ {
		wg.Add(1)
		go func(tok fencing.Token) {
			defer wg.Done()
			<-start
			rec, err := b.pc.Submit(ctx, s, tok, holder(int(tok)))
			results <- result{tok, rec, err}
		}(fencing.Token(i))
	}
	close(start)
	wg.Wait()
	close(results)

	var ok []result
	fenced, exists := 0, 0
	for r := range results {
		switch {
		case r.err == nil:
			ok = append(ok, r)
		case problem.Has(r.err, problem.FencedOut):
			fenced++
		case problem.Has(r.err, problem.SubmissionExists):
			exists++
			if rec, found := proxyclient.ExistingRecord(r.err); !found || rec.PayoutID != s.PayoutID || !rec.Forwarded() {
				t.Errorf("submission_exists without the existing record: %+v", rec)
			}
		default:
			t.Errorf("token %d: unexpected error %v", r.token, r.err)
		}
	}
	if len(ok) != 1 {
		t.Fatalf("%d submissions forwarded, want exactly 1 (fenced %d, exists %d)", len(ok), fenced, exists)
	}
	if fenced+exists != n-1 {
		t.Fatalf("fenced %d + exists %d != %d", fenced, exists, n-1)
	}
	win := ok[0]
	if win.rec.Outcome != proxyclient.OutcomeAcked || win.rec.RailRef == "" {
		t.Fatalf("winner: %+v, want ACKED with a rail reference", win.rec)
	}
	if got := b.atRail(t, s.ClientRef); len(got) != 1 {
		t.Fatalf("rail holds %d payments for %s, want exactly 1: %+v", len(got), s.ClientRef, got)
	}

	all, err := b.pc.GetAll(ctx, s.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	forwarded, fencedRows := 0, 0
	for _, r := range all {
		if r.Forwarded() {
			forwarded++
		} else {
			fencedRows++
		}
	}
	if forwarded != 1 || fencedRows != fenced {
		t.Fatalf("rows: %d forwarded (want 1), %d FENCED (want %d)", forwarded, fencedRows, fenced)
	}
	// Refused requests moved nothing: the mark is the winner's grant.
	hw, found := b.highWater(t, s.AccountID)
	if !found || hw.Token != win.token || hw.Holder != holder(int(win.token)) {
		t.Fatalf("high-water %+v, want token %d of the one forwarded submission", hw, win.token)
	}
	if got := len(b.safetyEvents(t)); got != fenced+exists {
		t.Fatalf("%d safety events, want %d", got, fenced+exists)
	}
	if got := counterValue(t, b.proxy.m.fencedOut); got != float64(fenced) {
		t.Errorf("fenced_out counter %v, want %d", got, fenced)
	}
	if got := counterValue(t, b.proxy.m.duplicates); got != float64(exists) {
		t.Errorf("duplicate counter %v, want %d", got, exists)
	}
}

func TestStaleTokenIsFencedAndNothingForwarded(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	first := sub("p-first", "acc-stale")
	if _, err := b.pc.Submit(ctx, first, 10, holder(10)); err != nil {
		t.Fatal(err)
	}

	// A stale holder submits another payout of the same account.
	stale := sub("p-stale", "acc-stale")
	_, err := b.pc.Submit(ctx, stale, 5, holder(5))
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Code != problem.FencedOut {
		t.Fatalf("stale submit: %v, want fenced_out", err)
	}
	if pe.Key != fencing.Key("acc-stale") || pe.PresentedToken != 5 || pe.StoredToken != 10 || pe.Status() != 409 {
		t.Fatalf("fenced_out details: key %q presented %d stored %d status %d", pe.Key, pe.PresentedToken, pe.StoredToken, pe.Status())
	}
	rec, err := b.pc.Get(ctx, stale.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != proxyclient.OutcomeFenced || rec.FenceToken != 5 || rec.Holder != holder(5) || rec.RailRef != "" {
		t.Fatalf("evidence row %+v, want FENCED with token 5", rec)
	}
	if got := b.atRail(t, stale.ClientRef); len(got) != 0 {
		t.Fatalf("stale submission reached the rail: %+v", got)
	}
	ev := b.safetyEvents(t)
	if len(ev) != 1 || ev[0].Kind != proxyclient.KindFencedOut || ev[0].PresentedToken != 5 || ev[0].StoredToken != 10 ||
		ev[0].StoredHolder != holder(10) || ev[0].PayoutID != stale.PayoutID || ev[0].Key != "payout:acc-stale" {
		t.Fatalf("safety events %+v", ev)
	}
	if !strings.Contains(b.logs.String(), `"level":"WARN","msg":"fenced_out`) {
		t.Errorf("no WARN fenced_out log line")
	}

	// A FENCED row is evidence only: a valid holder may still forward it.
	if rec, err := b.pc.Submit(ctx, stale, 11, holder(11)); err != nil || rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("valid resubmission after FENCED: %+v %v", rec, err)
	}
	got, err := b.pc.Get(ctx, stale.PayoutID)
	if err != nil || got.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("Get prefers the forwarded row: %+v %v", got, err)
	}
	hwBefore, _ := b.highWater(t, "acc-stale")

	// Refused requests move no high-water: a duplicate with a higher token...
	_, err = b.pc.Submit(ctx, first, 50, holder(50))
	existing, found := proxyclient.ExistingRecord(err)
	if !problem.Has(err, problem.SubmissionExists) || !found || existing.FenceToken != 10 || existing.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("duplicate: %v (existing %+v)", err, existing)
	}
	if !strings.Contains(b.logs.String(), `"level":"ERROR","msg":"duplicate_attempt`) {
		t.Errorf("no ERROR duplicate_attempt log line")
	}
	// ...and bad input with a higher token.
	bad := sub("p-bad", "acc-stale")
	bad.Amount = 0
	if _, err := b.pc.Submit(ctx, bad, 60, holder(60)); !problem.Has(err, problem.InvalidRequest) {
		t.Fatalf("bad input: %v", err)
	}
	if hw, _ := b.highWater(t, "acc-stale"); hw != hwBefore || hw.Token != 11 {
		t.Fatalf("high-water moved by a refused request: %+v, was %+v", hw, hwBefore)
	}
	if got := b.atRail(t, first.ClientRef); len(got) != 1 {
		t.Fatalf("rail holds %d payments for the first payout, want 1", len(got))
	}
	if hf, err := b.pc.HighFence(ctx); err != nil || hf != 11 {
		t.Fatalf("high fence %d %v, want 11", hf, err)
	}
}

// An equal token from a different holder means a token was re-issued:
// fenced out, and a token_regression event.
func TestEqualTokenOtherHolderIsTokenRegression(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-a", "acc-eq"), 7, "session-a"); err != nil {
		t.Fatal(err)
	}
	// The same holder may make another write under its grant.
	if _, err := b.pc.Submit(ctx, sub("p-b", "acc-eq"), 7, "session-a"); err != nil {
		t.Fatalf("same token, same holder: %v", err)
	}
	_, err := b.pc.Submit(ctx, sub("p-c", "acc-eq"), 7, "session-b")
	if !problem.Has(err, problem.FencedOut) || !problem.IsTokenRegression(err) {
		t.Fatalf("same token, other holder: %v, want fenced_out marked token_regression", err)
	}
	if _, err := b.pc.Submit(ctx, sub("p-d", "acc-eq"), 6, "session-c"); !problem.Has(err, problem.FencedOut) || problem.IsTokenRegression(err) {
		t.Fatalf("a lower token: %v, want fenced_out, not marked token_regression", err)
	}
	kinds := map[string]int{}
	for _, e := range b.safetyEvents(t) {
		kinds[e.Kind]++
		// The regression's row says what it is, not the fenced_out text.
		if e.Kind == proxyclient.KindTokenRegression && !strings.Contains(e.Detail, "re-issued") {
			t.Errorf("token_regression row detail %q, want it to say the token was re-issued", e.Detail)
		}
	}
	if kinds[proxyclient.KindFencedOut] != 2 || kinds[proxyclient.KindTokenRegression] != 1 {
		t.Fatalf("safety events by kind %v", kinds)
	}
	// Its log line carries the stored token beside the holders, as every
	// safety event's does.
	for _, line := range strings.Split(b.logs.String(), "\n") {
		if strings.Contains(line, "token_regression: the same token") && !strings.Contains(line, `"stored_token":7`) {
			t.Errorf("token_regression log line without the stored token: %s", line)
		}
	}
	if got := b.atRail(t, "po-p-c"); len(got) != 0 {
		t.Fatalf("regressed token reached the rail: %+v", got)
	}
}

// A token_regression is judged from the mark that refused the submission,
// as guard 2's statement returned it — not from a mark read afterwards,
// which a newer holder may have moved meanwhile (and which then hid the
// regression).
func TestTokenRegressionJudgedFromTheRefusingStatement(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-a", "acc-rg"), 7, "session-a"); err != nil {
		t.Fatal(err)
	}
	conn := pgtest.Conn(t, b.dbURL)
	moved := func() {
		if _, err := conn.Exec(context.Background(),
			`UPDATE account_high_water SET token = 9, holder = 'session-c' WHERE account_id = 'acc-rg'`); err != nil {
			t.Error(err)
		}
	}
	b.proxy.afterRefusal.Store(&moved)
	_, err := b.pc.Submit(ctx, sub("p-b", "acc-rg"), 7, "session-b") // token 7 again, from another holder
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Code != problem.FencedOut || pe.StoredToken != 7 {
		t.Fatalf("equal token from another holder: %v, want fenced_out naming stored token 7 (the mark that refused)", err)
	}
	var regressions []proxyclient.SafetyEvent
	for _, e := range b.safetyEvents(t) {
		if e.Kind == proxyclient.KindTokenRegression {
			regressions = append(regressions, e)
		}
	}
	if len(regressions) != 1 || regressions[0].StoredToken != 7 || regressions[0].StoredHolder != "session-a" {
		t.Fatalf("token_regression events %+v, want one judged against (7, session-a)", regressions)
	}
}

// A proxy's intent is answered only once on disk, whatever the server's
// default (the test clusters run with synchronous_commit off): an intent
// lost in a crash after its rail call would let the payout be sent again.
func TestCommitsAreDurableWhateverTheServersDefault(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	var v string
	if err := b.proxy.pool.QueryRow(ctxFor(t), "SHOW synchronous_commit").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if v != "on" {
		t.Fatalf("synchronous_commit = %q in the proxy's sessions, want on", v)
	}
}
