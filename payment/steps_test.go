package payment

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// items makes batch items of payout ids.
func items(ids ...string) []pc.StepItem {
	out := make([]pc.StepItem, len(ids))
	for i, id := range ids {
		out[i] = pc.StepItem{PayoutID: id}
	}
	return out
}

// steps applies a batch that must be accepted as a whole request.
func (e *testBundle) steps(t *testing.T, account string, tok fencing.Token, h fencing.Holder, op pc.StepOp, its []pc.StepItem) []pc.StepResult {
	t.Helper()
	res, err := e.exec.Steps(tctx(t), account, tok, h, op, its)
	if err != nil {
		t.Fatalf("%s batch on %s: %v", op, account, err)
	}
	if len(res) != len(its) {
		t.Fatalf("%s batch: %d results for %d items", op, len(res), len(its))
	}
	for i, r := range res {
		if r.PayoutID != its[i].PayoutID {
			t.Fatalf("%s batch: result %d is about %q, want %q", op, i, r.PayoutID, its[i].PayoutID)
		}
	}
	return res
}

func wantState(t *testing.T, r pc.StepResult, st pc.State) {
	t.Helper()
	if r.Err != nil || r.Payout.State != st {
		t.Fatalf("payout %s: %+v (err %v), want %s", r.PayoutID, r.Payout.State, r.Err, st)
	}
}

// TestStepsMixedItems: a batch whose items are in the wrong state, of
// another account or absent applies the others; each refused item has its
// own problem in its slot and a wrong state its own rejected_transition
// evidence, counter and log line.
func TestStepsMixedItems(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 10_000)
	e.account(t, "acc-2", 10_000)
	for _, id := range []string{"po-1", "po-2", "po-3"} {
		e.payout(t, id, "acc-1", 100)
	}
	e.payout(t, "po-other", "acc-2", 100)
	e.steps(t, "acc-1", 10, "h", pc.StepClaim, items("po-1", "po-3"))
	rej0 := counterValue(e.svc.m.rejectedTransitions.WithLabelValues(string(pc.Pending), string(EvSubmitting)))

	res := e.steps(t, "acc-1", 10, "h", pc.StepSubmitting, items("po-1", "po-2", "po-other", "po-none", "po-3"))
	wantState(t, res[0], pc.RailSubmitted)
	wantState(t, res[4], pc.RailSubmitted)
	if res[1].Err == nil || res[1].Err.Code != problem.InvalidTransition {
		t.Fatalf("PENDING payout in a submitting batch: %+v, want invalid_transition", res[1])
	}
	var st pc.State
	if !res[1].Err.Extension("state", &st) || st != pc.Pending {
		t.Fatalf("invalid_transition slot does not name the state: %+v", res[1].Err)
	}
	for _, i := range []int{2, 3} {
		if res[i].Err == nil || res[i].Err.Code != problem.NotFound {
			t.Fatalf("item %s: %+v, want not_found", res[i].PayoutID, res[i])
		}
	}
	if p, _ := e.exec.Payout(bg, "po-2"); p.State != pc.Pending {
		t.Fatalf("po-2 is %s, want PENDING", p.State)
	}
	if p, _ := e.exec.Payout(bg, "po-other"); p.State != pc.Pending || p.Token != 0 {
		t.Fatalf("another account's payout changed: %+v", p)
	}
	if a, _ := e.exec.Account(bg, "acc-2"); a.FenceToken != 0 {
		t.Fatalf("another account's fence moved: %+v", a)
	}
	if k := e.safetyKinds(t, "po-2"); strings.Join(k, ",") != pc.KindRejectedTransition {
		t.Fatalf("po-2 safety events %v, want one rejected_transition", k)
	}
	for _, id := range []string{"po-1", "po-3", "po-other"} {
		if k := e.safetyKinds(t, id); len(k) != 0 {
			t.Fatalf("%s has safety events %v", id, k)
		}
	}
	if d := counterValue(e.svc.m.rejectedTransitions.WithLabelValues(string(pc.Pending), string(EvSubmitting))) - rej0; d != 1 {
		t.Fatalf("rejected_transition counter moved by %v, want 1", d)
	}
	if !containsAll(e.logs.String(), `"msg":"rejected transition"`, `"payout_id":"po-2"`) {
		t.Fatal("no rejected transition log line for po-2")
	}
	// The line names its safety event once: a second "event" key (the
	// payout's event) would make log pipelines that keep the last key
	// lose event=rejected_transition.
	for _, line := range strings.Split(e.logs.String(), "\n") {
		if !strings.Contains(line, `"msg":"rejected transition"`) {
			continue
		}
		if strings.Count(line, `"event":`) != 1 || !containsAll(line, `"event":"rejected_transition"`, `"payout_event":"submitting"`, `"state":"PENDING"`) {
			t.Fatalf("rejected transition log line must carry event=rejected_transition once and the payout's event as payout_event: %s", line)
		}
	}
	if n := e.eventCount(t, "po-1"); n != 3 { // created, claimed, submitting
		t.Fatalf("po-1 has %d events, want 3", n)
	}

	// A batch in which nothing is accepted changes nothing, the fence included.
	res = e.steps(t, "acc-1", 11, "h2", pc.StepPost, items("po-1", "po-2"))
	for _, r := range res {
		if r.Err == nil || r.Err.Code != problem.InvalidTransition {
			t.Fatalf("post of a payout not RAIL_ACKED: %+v", r)
		}
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 10 || a.FenceHolder != "h" {
		t.Fatalf("a batch that changed nothing moved the fence: %+v", a)
	}
	e.assertLedger(t)
}

// TestStepsClaimFundsInOrder: the claims of a batch decide the funds in the
// request's order, against the held amount read once (D-7) plus what the
// batch itself has claimed.
func TestStepsClaimFundsInOrder(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-held", "acc-1", 300)
	e.drive(t, "po-held", pc.Claimed, 5, "h")
	e.payout(t, "po-a", "acc-1", 400)
	e.payout(t, "po-b", "acc-1", 250)
	e.payout(t, "po-c", "acc-1", 100)
	// Available 700: b (250) leaves 450, a (400) leaves 50, c (100) fails.
	res := e.steps(t, "acc-1", 5, "h", pc.StepClaim, items("po-b", "po-a", "po-c"))
	wantState(t, res[0], pc.Claimed)
	wantState(t, res[1], pc.Claimed)
	wantState(t, res[2], pc.Failed)
	if res[2].Payout.FailureReason != pc.FailureInsufficientFunds {
		t.Fatalf("po-c failure reason %q", res[2].Payout.FailureReason)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.Available != 50 {
		t.Fatalf("available %d after the batch, want 50", a.Available)
	}

	// In the other order the first claim takes the money.
	e.account(t, "acc-2", 500)
	e.payout(t, "po-x", "acc-2", 100)
	e.payout(t, "po-y", "acc-2", 450)
	res = e.steps(t, "acc-2", 6, "h", pc.StepClaim, items("po-y", "po-x"))
	wantState(t, res[0], pc.Claimed)
	wantState(t, res[1], pc.Failed)
	e.assertLedger(t)
}

// TestStepsClaimWhileCovered: with while_covered, the claims stop at the
// first PENDING item the funds do not cover once an item has been claimed;
// it and every item after it are answered as they stand, unchanged and
// without events, and the request commits the claims before it. An
// uncovered item before any claim fails on funds as without the flag: no
// money of the request is held that could come back.
func TestStepsClaimWhileCovered(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-a", "acc-1", 400)
	e.payout(t, "po-b", "acc-1", 700) // 600 left after po-a: not covered
	e.payout(t, "po-c", "acc-1", 100) // covered, but after po-b
	ev0 := map[string]int{}
	for _, id := range []string{"po-b", "po-c"} {
		ev0[id] = e.eventCount(t, id)
	}
	res, err := e.exec.PostSteps(tctx(t), "acc-1", pc.StepsRequest{Token: 5, Holder: "h", Op: pc.StepClaim, Then: pc.StepSubmitting,
		WhileCovered: true, Items: items("po-a", "po-b", "po-c")})
	if err != nil || len(res) != 3 {
		t.Fatalf("claim while covered: %+v, %v", res, err)
	}
	wantState(t, res[0], pc.RailSubmitted)
	for _, r := range res[1:] {
		wantState(t, r, pc.Pending)
		if r.PayoutID != r.Payout.ID || r.Payout.Token != 0 || r.Payout.ClaimedAt != nil {
			t.Fatalf("an item left unclaimed is not answered as it stands: %+v", r)
		}
		if n := e.eventCount(t, r.PayoutID); n != ev0[r.PayoutID] {
			t.Fatalf("%s left unclaimed has %d new events, want none", r.PayoutID, n-ev0[r.PayoutID])
		}
		if p, _ := e.exec.Payout(bg, r.PayoutID); p.State != pc.Pending {
			t.Fatalf("%s is %s in paydb, want PENDING", r.PayoutID, p.State)
		}
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.Available != 600 || a.FenceToken != 5 {
		t.Fatalf("account after the claim: %+v, want 600 available under fence 5", a)
	}

	// Nothing claimed yet: an uncovered first item fails on funds, and the
	// claims go on with the next.
	e.account(t, "acc-2", 500)
	e.payout(t, "po-x", "acc-2", 800)
	e.payout(t, "po-y", "acc-2", 300)
	e.payout(t, "po-z", "acc-2", 300) // 200 left after po-y: waits
	res, err = e.exec.PostSteps(tctx(t), "acc-2", pc.StepsRequest{Token: 6, Holder: "h", Op: pc.StepClaim,
		WhileCovered: true, Items: items("po-x", "po-y", "po-z")})
	if err != nil || len(res) != 3 {
		t.Fatalf("claim while covered: %+v, %v", res, err)
	}
	wantState(t, res[0], pc.Failed)
	if res[0].Payout.FailureReason != pc.FailureInsufficientFunds {
		t.Fatalf("po-x failure reason %q", res[0].Payout.FailureReason)
	}
	wantState(t, res[1], pc.Claimed)
	wantState(t, res[2], pc.Pending)

	// Without the flag the same uncovered item fails on funds.
	res = e.steps(t, "acc-2", 6, "h", pc.StepClaim, items("po-z"))
	wantState(t, res[0], pc.Failed)

	// Past the stop only PENDING items wait: a claim of a finished payout
	// is refused there as anywhere, with its evidence.
	e.account(t, "acc-3", 1_000)
	e.payout(t, "po-p", "acc-3", 400)
	e.payout(t, "po-q", "acc-3", 700) // 600 left after po-p: the stop
	e.payout(t, "po-r", "acc-3", 100)
	e.drive(t, "po-r", pc.Posted, 7, "h")
	res, err = e.exec.PostSteps(tctx(t), "acc-3", pc.StepsRequest{Token: 7, Holder: "h", Op: pc.StepClaim,
		WhileCovered: true, Items: items("po-p", "po-q", "po-r")})
	if err != nil || len(res) != 3 {
		t.Fatalf("claim while covered: %+v, %v", res, err)
	}
	wantState(t, res[0], pc.Claimed)
	wantState(t, res[1], pc.Pending)
	if res[2].Err == nil || res[2].Err.Code != problem.InvalidTransition {
		t.Fatalf("a POSTED payout after the stop: %+v, want invalid_transition", res[2])
	}
	if k := e.safetyKinds(t, "po-r"); strings.Join(k, ",") != pc.KindRejectedTransition {
		t.Fatalf("po-r safety events %v, want one rejected_transition", k)
	}
	e.assertLedger(t)
}

// TestRefusedItemsKeepTheirEvidenceWhenTheWriteFails: a batch whose
// accepted items cannot be written (the database refuses the write) rolls
// back, and the items it refused keep their rejected_transition evidence:
// they were never to be written, and their caller, finding them finished,
// will not ask again.
func TestRefusedItemsKeepTheirEvidenceWhenTheWriteFails(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 10_000)
	e.payout(t, "po-ok", "acc-1", 100)
	e.payout(t, "po-done", "acc-1", 100)
	e.drive(t, "po-done", pc.Posted, 5, "h")
	if _, err := e.svc.pool.Exec(tctx(t), `
		CREATE FUNCTION refuse_write() RETURNS trigger LANGUAGE plpgsql AS $$
		BEGIN RAISE EXCEPTION 'write refused by the test'; END $$;
		CREATE TRIGGER refuse_write BEFORE UPDATE ON payout FOR EACH ROW
		WHEN (NEW.id = 'po-ok') EXECUTE FUNCTION refuse_write();`); err != nil {
		t.Fatal(err)
	}
	_, err := e.exec.PostSteps(tctx(t), "acc-1", pc.StepsRequest{Token: 6, Holder: "h", Op: pc.StepClaim, Items: items("po-ok", "po-done")})
	if err == nil {
		t.Fatal("a batch whose write the database refused was answered as applied")
	}
	if p, _ := e.exec.Payout(bg, "po-ok"); p.State != pc.Pending {
		t.Fatalf("po-ok is %s after a failed write, want PENDING", p.State)
	}
	if k := e.safetyKinds(t, "po-done"); strings.Join(k, ",") != pc.KindRejectedTransition {
		t.Fatalf("po-done safety events %v, want one rejected_transition", k)
	}
}

// TestStepsWhileCoveredIsForClaims: while_covered on any other op is
// refused as a whole, naming the field.
func TestStepsWhileCoveredIsForClaims(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-a", "acc-1", 400)
	e.drive(t, "po-a", pc.Claimed, 5, "h")
	_, err := e.exec.PostSteps(tctx(t), "acc-1", pc.StepsRequest{Token: 5, Holder: "h", Op: pc.StepSubmitting,
		WhileCovered: true, Items: items("po-a")})
	var f string
	if pe := wantCode(t, err, problem.InvalidRequest); !pe.Extension("field", &f) || f != "while_covered" {
		t.Fatalf("field %q, want while_covered (%v)", f, pe)
	}
	if p, _ := e.exec.Payout(bg, "po-a"); p.State != pc.Claimed {
		t.Fatalf("po-a is %s after a refused request", p.State)
	}
}

// TestStepsDriveAndPostBalanced drives payouts through every batched step
// and posts them in one batch: one ledger group per payout, the account
// debited and payout-clearing credited by the total, INV-03 holds.
func TestStepsDriveAndPostBalanced(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 100_000)
	var ids []string
	var total int64
	for i := range 7 {
		id := fmt.Sprintf("po-%d", i)
		e.payout(t, id, "acc-1", int64(100*(i+1)))
		ids = append(ids, id)
		total += int64(100 * (i + 1))
	}
	clearing0, _ := e.exec.Account(bg, pc.ClearingAccount)
	const tok, h = fencing.Token(3), fencing.Holder("h")
	for _, r := range e.steps(t, "acc-1", tok, h, pc.StepClaim, items(ids...)) {
		wantState(t, r, pc.Claimed)
	}
	for _, r := range e.steps(t, "acc-1", tok, h, pc.StepSubmitting, items(ids...)) {
		wantState(t, r, pc.RailSubmitted)
	}
	outs := items(ids...)
	for i := range outs {
		outs[i].Outcome, outs[i].RailRef = pc.OutcomeAcked, "rail-"+outs[i].PayoutID
	}
	outs[6].Outcome, outs[6].RailRef, outs[6].ErrorCode = pc.OutcomeRejected, "", "DECLINED"
	res := e.steps(t, "acc-1", tok, h, pc.StepOutcome, outs)
	for _, r := range res[:6] {
		wantState(t, r, pc.RailAcked)
		if r.Payout.RailRef != "rail-"+r.PayoutID {
			t.Fatalf("%s rail_ref %q", r.PayoutID, r.Payout.RailRef)
		}
	}
	wantState(t, res[6], pc.Failed)
	total -= 700
	for _, r := range e.steps(t, "acc-1", tok, h, pc.StepPost, items(ids[:6]...)) {
		wantState(t, r, pc.Posted)
		if r.Payout.SettledAt == nil {
			t.Fatalf("%s posted without settled_at", r.PayoutID)
		}
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.Balance != 100_000-total || a.Available != a.Balance {
		t.Fatalf("account after the batch post: %+v, want balance %d", a, 100_000-total)
	}
	if c, _ := e.exec.Account(bg, pc.ClearingAccount); c.Balance != clearing0.Balance+total {
		t.Fatalf("clearing balance %d, want %d", c.Balance, clearing0.Balance+total)
	}
	var entries, groups int
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*), count(DISTINCT group_id) FROM ledger_entry WHERE payout_id = ANY($1)`, ids).Scan(&entries, &groups); err != nil {
		t.Fatal(err)
	}
	if entries != 12 || groups != 6 {
		t.Fatalf("%d ledger entries in %d groups, want 12 in 6", entries, groups)
	}
	e.assertLedger(t)
}

// TestStepsBadInput: a malformed batch is a 4xx that changes nothing and
// records nothing; only the executor and the operator may send one.
func TestStepsBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	before := e.counts(t)
	many := make([]string, pc.MaxStepItems+1)
	for i := range many {
		many[i] = fmt.Sprintf(`{"payout_id":"po-%d"}`, i)
	}
	for _, c := range []struct {
		path, body, field string
		code              problem.Code
	}{
		{"acc-1", `{"token":1,"holder":"h","op":"cancel","items":[{"payout_id":"po-1"}]}`, "op", problem.InvalidRequest},
		{"acc-1", `{"token":0,"holder":"h","op":"claim","items":[{"payout_id":"po-1"}]}`, "token", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"","op":"claim","items":[{"payout_id":"po-1"}]}`, "holder", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"claim","items":[]}`, "items", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"claim","items":[` + strings.Join(many, ",") + `]}`, "items", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1"},{"payout_id":"po-1"}]}`, "items[1].payout_id", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po 1"}]}`, "items[0].payout_id", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1","outcome":"ACKED"}]}`, "items[0].outcome", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"outcome","items":[{"payout_id":"po-1","outcome":"ACKED","rail_ref":"r-1"},{"payout_id":"po-2","outcome":"ACKED"}]}`, "items[1].rail_ref", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"outcome","items":[{"payout_id":"po-1","outcome":"MAYBE"}]}`, "items[0].outcome", problem.InvalidRequest},
		{"acc-1", `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1"}],"extra":1}`, "", problem.InvalidRequest},
		{"acc-none", `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1"}]}`, "", problem.NotFound},
		{pc.ClearingAccount, `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1"}]}`, "", problem.NotFound},
	} {
		status, body := e.rawPost(t, "/v1/accounts/"+c.path+"/steps", executorBearer, c.body)
		pe := wantCode(t, problem.DecodeBody(status, []byte(body)), c.code)
		var f string
		if c.field != "" && (!pe.Extension("field", &f) || f != c.field) {
			t.Errorf("%s: problem %+v does not name field %s", c.body, pe, c.field)
		}
	}
	for bearer, want := range map[string]int{reconcilerBearer: http.StatusForbidden, proxyBearer: http.StatusForbidden, "": http.StatusUnauthorized} {
		status, _ := e.rawPost(t, "/v1/accounts/acc-1/steps", bearer, `{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1"}]}`)
		if status != want {
			t.Errorf("bearer %q: status %d, want %d", bearer, status, want)
		}
	}
	if after := e.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("rows changed: %v -> %v", before, after)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 0 {
		t.Fatalf("fence moved: %+v", a)
	}
}

// rawPost sends body to path with a bearer token ("" for none).
func (e *testBundle) rawPost(t *testing.T, path, bearer, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), http.MethodPost, e.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// ApplySteps itself refuses a batch that lists a payout twice, not only
// the HTTP decoder: both items would be decided against the row as it
// stood, and a RAIL_ACKED payout listed twice in a post was posted twice
// (its account debited twice, four ledger entries, each group balanced).
func TestApplyStepsRefusesAPayoutListedTwice(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", pc.RailAcked, 1, "h")
	before := e.counts(t)
	_, err := e.svc.ApplySteps(bg, Steps{Account: "acc-1", Cmd: Command{Op: OpPost, Token: 1, Holder: "h"}, Items: items("po-1", "po-1")})
	if !problem.Has(err, problem.InvalidRequest) {
		t.Fatalf("a post listing po-1 twice: %v, want invalid_request", err)
	}
	if after := e.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("rows changed: %v -> %v", before, after)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.Balance != 1_000 {
		t.Fatalf("balance %d after a refused post, want 1000", a.Balance)
	}
}
