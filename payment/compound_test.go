package payment

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// compound applies a compound batch that must be accepted as a whole request.
func (e *testBundle) compound(t *testing.T, account string, tok fencing.Token, h fencing.Holder, op, then pc.StepOp, its []pc.StepItem) []pc.StepResult {
	t.Helper()
	res, err := e.exec.StepsThen(tctx(t), account, tok, h, op, then, its)
	if err != nil {
		t.Fatalf("%s+%s batch on %s: %v", op, then, account, err)
	}
	if len(res) != len(its) {
		t.Fatalf("%s+%s batch: %d results for %d items", op, then, len(res), len(its))
	}
	for i, r := range res {
		if r.PayoutID != its[i].PayoutID {
			t.Fatalf("%s+%s batch: result %d is about %q, want %q", op, then, i, r.PayoutID, its[i].PayoutID)
		}
	}
	return res
}

// eventRow is one payout_event row.
type eventRow struct {
	from, to, holder, reason string
	token                    int64
}

// eventsSince returns a payout's events after its first n, in id order.
func (e *testBundle) eventsSince(t *testing.T, payoutID string, n int) []eventRow {
	t.Helper()
	rows, err := e.svc.pool.Query(tctx(t), `SELECT COALESCE(from_state, ''), to_state, COALESCE(holder, ''), COALESCE(reason, ''), COALESCE(token, 0)
		FROM payout_event WHERE payout_id = $1 ORDER BY id OFFSET $2`, payoutID, n)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []eventRow
	for rows.Next() {
		var r eventRow
		if err := rows.Scan(&r.from, &r.to, &r.holder, &r.reason, &r.token); err != nil {
			t.Fatal(err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// wantEvents checks a payout's events after its first n: from -> to, in
// order, each under (tok, h) with a reason starting as given.
func (e *testBundle) wantEvents(t *testing.T, payoutID string, n int, tok fencing.Token, h fencing.Holder, want ...[3]string) {
	t.Helper()
	got := e.eventsSince(t, payoutID, n)
	if len(got) != len(want) {
		t.Fatalf("%s: %d new events %+v, want %d", payoutID, len(got), got, len(want))
	}
	for i, w := range want {
		g := got[i]
		if g.from != w[0] || g.to != w[1] || !strings.HasPrefix(g.reason, w[2]) || g.token != int64(tok) || g.holder != string(h) {
			t.Fatalf("%s event %d: %+v, want %s -> %s (%q...) under %d/%s", payoutID, i, g, w[0], w[1], w[2], tok, h)
		}
	}
}

func transitionCount(e *testBundle, from, to pc.State) float64 {
	return counterValue(e.svc.m.transitions.WithLabelValues(string(from), string(to)))
}

// TestCompoundClaimSubmitting: claim then submitting in one request moves a
// PENDING payout (and a previous holder's CLAIMED one, re-claimed) to
// RAIL_SUBMITTED with an event per transition, in order, and holds its
// funds; a claim that fails on funds ends FAILED with its one event; a
// payout in the wrong state is refused for the claim alone, with its one
// rejected_transition; the transitions counter counts every transition.
func TestCompoundClaimSubmitting(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-old", "acc-1", 100)
	e.drive(t, "po-old", pc.Claimed, 5, "old-holder")
	e.payout(t, "po-sub", "acc-1", 100)
	e.drive(t, "po-sub", pc.RailSubmitted, 5, "old-holder")
	e.payout(t, "po-a", "acc-1", 400)
	e.payout(t, "po-b", "acc-1", 300)
	e.payout(t, "po-c", "acc-1", 200) // available 1000-200 held: a and b leave 100
	const tok, h = fencing.Token(6), fencing.Holder("new-holder")
	claimed0, submitted0 := transitionCount(e, pc.Pending, pc.Claimed), transitionCount(e, pc.Claimed, pc.RailSubmitted)
	reclaimed0, failed0 := transitionCount(e, pc.Claimed, pc.Claimed), transitionCount(e, pc.Pending, pc.Failed)
	rej0 := counterValue(e.svc.m.rejectedTransitions.WithLabelValues(string(pc.RailSubmitted), string(EvClaim)))
	n := map[string]int{}
	for _, id := range []string{"po-old", "po-sub", "po-a", "po-b", "po-c"} {
		n[id] = e.eventCount(t, id)
	}

	res := e.compound(t, "acc-1", tok, h, pc.StepClaim, pc.StepSubmitting, items("po-a", "po-old", "po-sub", "po-b", "po-c"))
	for _, i := range []int{0, 1, 3} {
		r := res[i]
		wantState(t, r, pc.RailSubmitted)
		if r.Payout.ClaimedBy != h || r.Payout.Token != tok || r.Payout.ClaimedAt == nil || r.Payout.SubmittedAt == nil {
			t.Fatalf("%s after claim+submitting: %+v", r.PayoutID, r.Payout)
		}
	}
	for _, id := range []string{"po-a", "po-b"} {
		e.wantEvents(t, id, n[id], tok, h, [3]string{"PENDING", "CLAIMED", "claimed"}, [3]string{"CLAIMED", "RAIL_SUBMITTED", "submitting"})
	}
	e.wantEvents(t, "po-old", n["po-old"], tok, h, [3]string{"CLAIMED", "CLAIMED", "re-claimed"}, [3]string{"CLAIMED", "RAIL_SUBMITTED", "submitting"})

	wantState(t, res[4], pc.Failed)
	if p := res[4].Payout; p.FailureReason != pc.FailureInsufficientFunds || p.SubmittedAt != nil || p.ClaimedAt != nil {
		t.Fatalf("po-c after a claim short of funds: %+v", p)
	}
	e.wantEvents(t, "po-c", n["po-c"], tok, h, [3]string{"PENDING", "FAILED", pc.FailureInsufficientFunds})

	if res[2].Err == nil || res[2].Err.Code != problem.InvalidTransition {
		t.Fatalf("claim of a RAIL_SUBMITTED payout: %+v, want invalid_transition", res[2])
	}
	e.wantEvents(t, "po-sub", n["po-sub"], tok, h)
	if k := e.safetyKinds(t, "po-sub"); strings.Join(k, ",") != pc.KindRejectedTransition {
		t.Fatalf("po-sub safety events %v, want one rejected_transition", k)
	}
	for _, id := range []string{"po-a", "po-b", "po-c", "po-old"} {
		if k := e.safetyKinds(t, id); len(k) != 0 {
			t.Fatalf("%s has safety events %v", id, k)
		}
	}

	// Held: po-sub 100 and po-a, po-b, po-old 800.
	if a, _ := e.exec.Account(bg, "acc-1"); a.Balance != 1_000 || a.Available != 100 || a.FenceToken != tok || a.FenceHolder != h {
		t.Fatalf("account after claim+submitting: %+v, want available 100 under the new fence", a)
	}
	for _, c := range []struct {
		from, to  pc.State
		was, want float64
	}{
		{pc.Pending, pc.Claimed, claimed0, 2}, {pc.Claimed, pc.RailSubmitted, submitted0, 3},
		{pc.Claimed, pc.Claimed, reclaimed0, 1}, {pc.Pending, pc.Failed, failed0, 1},
	} {
		if d := transitionCount(e, c.from, c.to) - c.was; d != c.want {
			t.Errorf("transitions %s -> %s moved by %v, want %v", c.from, c.to, d, c.want)
		}
	}
	if d := counterValue(e.svc.m.rejectedTransitions.WithLabelValues(string(pc.RailSubmitted), string(EvClaim))) - rej0; d != 1 {
		t.Fatalf("rejected_transition counter moved by %v, want 1", d)
	}
	e.assertLedger(t)
}

// TestCompoundOutcomePost: outcome then post in one request posts an
// acknowledged payout — its ledger group, the account debited and
// payout-clearing credited, the rail reference kept — with an event per
// transition; a declined one ends FAILED and a timed-out one
// RAIL_AMBIGUOUS, each with its one event and no posting.
func TestCompoundOutcomePost(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 10_000)
	ids := []string{"po-ack", "po-decl", "po-time"}
	for i, id := range ids {
		e.payout(t, id, "acc-1", int64(1_000*(i+1)))
	}
	const tok, h = fencing.Token(3), fencing.Holder("h")
	for _, r := range e.compound(t, "acc-1", tok, h, pc.StepClaim, pc.StepSubmitting, items(ids...)) {
		wantState(t, r, pc.RailSubmitted)
	}
	clearing0, _ := e.exec.Account(bg, pc.ClearingAccount)
	before := e.counts(t)
	n := map[string]int{}
	for _, id := range ids {
		n[id] = e.eventCount(t, id)
	}
	acked0, posted0 := transitionCount(e, pc.RailSubmitted, pc.RailAcked), transitionCount(e, pc.RailAcked, pc.Posted)

	outs := []pc.StepItem{
		{PayoutID: "po-ack", Outcome: pc.OutcomeAcked, RailRef: "rail-ack"},
		{PayoutID: "po-decl", Outcome: pc.OutcomeRejected, ErrorCode: "DECLINED"},
		{PayoutID: "po-time", Outcome: pc.OutcomeTimeout},
	}
	res := e.compound(t, "acc-1", tok, h, pc.StepOutcome, pc.StepPost, outs)
	wantState(t, res[0], pc.Posted)
	if p := res[0].Payout; p.RailRef != "rail-ack" || p.SettledAt == nil {
		t.Fatalf("po-ack after outcome+post: %+v, want rail_ref rail-ack and settled_at", p)
	}
	e.wantEvents(t, "po-ack", n["po-ack"], tok, h,
		[3]string{"RAIL_SUBMITTED", "RAIL_ACKED", "outcome ACKED rail_ref=rail-ack"}, [3]string{"RAIL_ACKED", "POSTED", "posted"})
	wantState(t, res[1], pc.Failed)
	if p := res[1].Payout; p.FailureReason != "rail_declined" || p.ErrorCode != "DECLINED" || p.SettledAt != nil {
		t.Fatalf("po-decl after outcome+post: %+v", p)
	}
	e.wantEvents(t, "po-decl", n["po-decl"], tok, h, [3]string{"RAIL_SUBMITTED", "FAILED", "outcome REJECTED"})
	wantState(t, res[2], pc.RailAmbiguous)
	e.wantEvents(t, "po-time", n["po-time"], tok, h, [3]string{"RAIL_SUBMITTED", "RAIL_AMBIGUOUS", "outcome TIMEOUT"})

	after := e.counts(t)
	if d := after["ledger_entry"] - before["ledger_entry"]; d != 2 {
		t.Fatalf("%d ledger entries for one posted payout, want 2", d)
	}
	var groups []string
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT array_agg(DISTINCT group_id) FROM ledger_entry WHERE payout_id = ANY($1)`, ids).Scan(&groups); err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(groups) != "[post:po-ack]" {
		t.Fatalf("ledger groups %v, want only po-ack's", groups)
	}
	// Held: po-time's 3000 (ambiguous money stays held, D-7).
	if a, _ := e.exec.Account(bg, "acc-1"); a.Balance != 9_000 || a.Available != 6_000 {
		t.Fatalf("account after outcome+post: %+v, want balance 9000, available 6000", a)
	}
	if c, _ := e.exec.Account(bg, pc.ClearingAccount); c.Balance != clearing0.Balance+1_000 {
		t.Fatalf("clearing balance %d, want %d", c.Balance, clearing0.Balance+1_000)
	}
	if d := transitionCount(e, pc.RailSubmitted, pc.RailAcked) - acked0; d != 1 {
		t.Errorf("transitions RAIL_SUBMITTED -> RAIL_ACKED moved by %v, want 1", d)
	}
	if d := transitionCount(e, pc.RailAcked, pc.Posted) - posted0; d != 1 {
		t.Errorf("transitions RAIL_ACKED -> POSTED moved by %v, want 1", d)
	}
	for _, id := range ids {
		if k := e.safetyKinds(t, id); len(k) != 0 {
			t.Fatalf("%s has safety events %v", id, k)
		}
	}
	e.assertLedger(t)
}

// TestCompoundBadThen: a then other than submitting after claim or post
// after outcome is invalid_request naming the field, and changes nothing.
func TestCompoundBadThen(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	before := e.counts(t)
	for _, c := range []struct{ op, then string }{
		{"claim", "post"}, {"claim", "claim"}, {"claim", "outcome"}, {"outcome", "submitting"},
		{"submitting", "post"}, {"post", "post"}, {"claim", "cancel"}, {"claim", "SUBMITTING"},
	} {
		body := fmt.Sprintf(`{"token":1,"holder":"h","op":%q,"then":%q,"items":[{"payout_id":"po-1"}]}`, c.op, c.then)
		status, answer := e.rawPost(t, "/v1/accounts/acc-1/steps", executorBearer, body)
		pe := wantCode(t, problem.DecodeBody(status, []byte(answer)), problem.InvalidRequest)
		var f string
		if !pe.Extension("field", &f) || f != "then" {
			t.Errorf("%s: problem %+v does not name field then", body, pe)
		}
	}
	if _, err := e.svc.ApplySteps(bg, Steps{Account: "acc-1", Cmd: Command{Op: OpSubmitting, Token: 1, Holder: "h"}, Then: OpPost, Items: items("po-1")}); !problem.Has(err, problem.InvalidRequest) {
		t.Fatalf("ApplySteps submitting then post: %v, want invalid_request", err)
	}
	if after := e.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("rows changed: %v -> %v", before, after)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 0 {
		t.Fatalf("fence moved: %+v", a)
	}
}

// FuzzDecodeSteps: the steps decoder accepts a request or answers a 4xx;
// what it accepts has a valid fence, 1..MaxStepItems items and, when
// compound, one of the two allowed pairs.
func FuzzDecodeSteps(f *testing.F) {
	for _, s := range []string{
		`{"token":1,"holder":"h","op":"claim","items":[{"payout_id":"po-1"}]}`,
		`{"token":1,"holder":"h","op":"claim","then":"submitting","items":[{"payout_id":"po-1"},{"payout_id":"po-2"}]}`,
		`{"token":1,"holder":"h","op":"outcome","then":"post","items":[{"payout_id":"po-1","outcome":"ACKED","rail_ref":"r"}]}`,
		`{"token":1,"holder":"h","op":"outcome","then":"submitting","items":[{"payout_id":"po-1","outcome":"TIMEOUT"}]}`,
		`{"token":1,"holder":"h","op":"post","then":"post","items":[{"payout_id":"po-1"}]}`,
		`{"token":1,"holder":"h","op":"claim","then":"","items":[{"payout_id":"po-1"}]}`,
		`{"token":1,"holder":"h","op":"claim","then":null,"items":[]}`, `{"then":1}`, `null`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		b, err := decodeSteps(httptest.NewRequest("POST", "/", bytes.NewReader(body)), "acc-1")
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if !b.Cmd.Token.Valid() || b.Cmd.Holder == "" || len(b.Items) == 0 || len(b.Items) > pc.MaxStepItems {
			t.Fatalf("accepted an invalid steps request: %+v", b)
		}
		if f, ok := thenFrom[b.Then]; b.Then != "" && (!ok || f.after != b.Cmd.Op) {
			t.Fatalf("accepted %s then %s", b.Cmd.Op, b.Then)
		}
	})
}
