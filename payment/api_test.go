package payment

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

func TestAccountsAndOpeningLedger(t *testing.T) {
	t.Parallel()
	e := setup(t)
	a := e.account(t, "acc-1", 5_000)
	if a.Balance != 5_000 || a.Available != 5_000 || a.Currency != "EUR" || a.FenceToken != 0 {
		t.Fatalf("new account %+v", a)
	}
	// Idempotent: same body returns the account; a different one conflicts.
	if again := e.account(t, "acc-1", 5_000); again != a {
		t.Fatalf("re-create returned %+v", again)
	}
	_, err := e.oper.CreateAccount(bg, pc.CreateAccountRequest{ID: "acc-1", Currency: "EUR", OpeningBalance: 6_000})
	wantCode(t, err, problem.Conflict)
	e.account(t, "acc-0", 0)
	led, err := e.recon.Ledger(bg, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(led.Items) != 2 || led.Items[0].GroupID != led.Items[1].GroupID || led.Items[0].Amount+led.Items[1].Amount != 0 {
		t.Fatalf("opening group %+v", led.Items)
	}
	f, _ := e.exec.Account(bg, pc.FundingAccount)
	if f.Balance != -5_000 {
		t.Fatalf("funding balance %d", f.Balance)
	}
	// The balance beside its ledger entries, read together.
	for id, want := range map[string]pc.LedgerSum{
		"acc-1":           {AccountID: "acc-1", Balance: 5_000, LedgerSum: 5_000, Entries: 1},
		"acc-0":           {AccountID: "acc-0", Balance: 0, LedgerSum: 0, Entries: 0},
		pc.FundingAccount: {AccountID: pc.FundingAccount, Balance: -5_000, LedgerSum: -5_000, Entries: 1},
	} {
		if l, err := e.recon.LedgerSum(bg, id); err != nil || l != want {
			t.Fatalf("ledger sum of %s: %+v %v, want %+v", id, l, err, want)
		}
	}
	_, err = e.recon.LedgerSum(bg, "acc-none")
	wantCode(t, err, problem.NotFound)
	list, err := e.exec.Accounts(bg, "", 2)
	if err != nil || len(list.Items) != 2 || list.Next == "" {
		t.Fatalf("accounts page 1: %+v %v", list, err)
	}
	rest, err := e.exec.Accounts(bg, list.Next, 10)
	if err != nil || len(rest.Items) != 2 || rest.Next != "" {
		t.Fatalf("accounts page 2: %+v %v", rest, err)
	}
	e.assertLedger(t)
}

func TestPayoutLifecycleAndReads(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	p := e.payout(t, "po-1", "acc-1", 400)
	if p.State != pc.Pending || p.ClientRef != "po-po-1" || p.Token != 0 || p.ClaimedAt != nil {
		t.Fatalf("new payout %+v", p)
	}
	// Idempotent creation.
	if again := e.payout(t, "po-1", "acc-1", 400); again.ID != p.ID || !again.CreatedAt.Equal(p.CreatedAt) {
		t.Fatalf("re-create returned %+v", again)
	}
	_, err := e.oper.CreatePayout(bg, pc.CreatePayoutRequest{ID: "po-1", AccountID: "acc-1", Amount: 401, Currency: "EUR", BeneficiaryRef: "ben-po-1"})
	wantCode(t, err, problem.Conflict)
	// A different body under the id is a conflict, also when its account
	// does not exist.
	_, err = e.oper.CreatePayout(bg, pc.CreatePayoutRequest{ID: "po-1", AccountID: "acc-none", Amount: 400, Currency: "EUR", BeneficiaryRef: "ben-po-1"})
	wantCode(t, err, problem.Conflict)

	if w, err := e.exec.Work(bg, 10); err != nil || len(w) != 1 || w[0].AccountID != "acc-1" || w[0].Payouts != 1 {
		t.Fatalf("work %+v %v", w, err)
	}
	p = e.drive(t, "po-1", pc.Posted, 3, "h-1")
	if p.State != pc.Posted || p.SettledAt == nil || p.RailRef != "rail-po-1" || p.ClaimedBy != "h-1" {
		t.Fatalf("posted payout %+v", p)
	}
	a, _ := e.exec.Account(bg, "acc-1")
	c, _ := e.exec.Account(bg, pc.ClearingAccount)
	if a.Balance != 600 || a.Available != 600 || c.Balance != 400 {
		t.Fatalf("after posting: account %+v clearing %+v", a, c)
	}
	led, _ := e.recon.Ledger(bg, 2, 10)
	if len(led.Items) != 2 {
		t.Fatalf("posting wrote %d entries", len(led.Items))
	}
	for _, le := range led.Items {
		if le.PayoutID != "po-1" || le.Token != 3 || le.GroupID != led.Items[0].GroupID {
			t.Fatalf("posting entry %+v", le)
		}
	}
	if led.Items[0].Amount != -400 || led.Items[0].AccountID != "acc-1" || led.Items[1].AccountID != pc.ClearingAccount {
		t.Fatalf("posting legs %+v", led.Items)
	}
	evs, err := e.recon.PayoutEvents(bg, "po-1", 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	var path []string
	for _, ev := range evs.Items {
		path = append(path, string(ev.ToState))
	}
	if strings.Join(path, ">") != "PENDING>CLAIMED>RAIL_SUBMITTED>RAIL_ACKED>POSTED" {
		t.Fatalf("event history %v", path)
	}
	if w, _ := e.exec.Work(bg, 10); len(w) != 0 {
		t.Fatalf("work after posting: %+v", w)
	}
	if l, err := e.exec.Payouts(bg, pc.PayoutFilter{State: pc.Posted, AccountID: "acc-1"}); err != nil || len(l.Items) != 1 {
		t.Fatalf("list posted: %+v %v", l, err)
	}
	if l, _ := e.exec.Payouts(bg, pc.PayoutFilter{State: pc.Pending}); len(l.Items) != 0 {
		t.Fatalf("list pending: %+v", l)
	}
	_, err = e.exec.Payout(bg, "nope")
	wantCode(t, err, problem.NotFound)
	_, err = e.exec.Claim(bg, "nope", 9, "h")
	wantCode(t, err, problem.NotFound)
	e.assertLedger(t)
}

func TestRoles(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 1)
	_, err := e.exec.CreatePayout(bg, pc.CreatePayoutRequest{ID: "po-2", AccountID: "acc-1", Amount: 1, Currency: "EUR", BeneficiaryRef: "b"})
	wantCode(t, err, problem.Forbidden)
	_, err = e.exec.Cancel(bg, "po-1", 1, "h", "no")
	wantCode(t, err, problem.Forbidden)
	_, err = e.exec.Resolve(bg, "po-1", 1, "h", pc.ResolutionAbsent, "x", "")
	wantCode(t, err, problem.Forbidden)
	_, err = e.recon.Claim(bg, "po-1", 1, "h")
	wantCode(t, err, problem.Forbidden)
	// The proxy role is a credential at the rail only: it reads nothing here.
	_, err = e.proxy.Payout(bg, "po-1")
	wantCode(t, err, problem.Forbidden)
	_, err = e.proxy.Work(bg, 10)
	wantCode(t, err, problem.Forbidden)
	_, err = e.proxy.Claim(bg, "po-1", 1, "h")
	wantCode(t, err, problem.Forbidden)
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 0 {
		t.Fatalf("forbidden request moved the fence: %+v", a)
	}
}

// TestBadInput: every malformed request is a 4xx problem naming the field,
// and no row is written anywhere.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	e.drive(t, "po-1", pc.RailSubmitted, 4, "h")
	payout := func(mut string) string {
		return strings.Replace(`{"id":"po-2","account_id":"acc-1","amount":100,"currency":"EUR","beneficiary_ref":"b"}`, `"amount":100`, mut, 1)
	}
	cases := []struct {
		name, path, body, field string
		status                  int
	}{
		{"negative amount", "/v1/payouts", payout(`"amount":-5`), "amount", 400},
		{"zero amount", "/v1/payouts", payout(`"amount":0`), "amount", 400},
		{"oversized amount", "/v1/payouts", payout(`"amount":1000000000000000`), "amount", 400},
		{"fractional amount", "/v1/payouts", payout(`"amount":1.5`), "amount", 400},
		{"amount as string", "/v1/payouts", payout(`"amount":"100"`), "amount", 400},
		{"wrong currency", "/v1/payouts", strings.Replace(payout(`"amount":100`), "EUR", "USD", 1), "currency", 400},
		{"unknown account", "/v1/payouts", strings.Replace(payout(`"amount":100`), "acc-1", "acc-9", 1), "account_id", 400},
		{"system account", "/v1/payouts", strings.Replace(payout(`"amount":100`), `"acc-1"`, `"funding"`, 1), "account_id", 400},
		{"bad id", "/v1/payouts", strings.Replace(payout(`"amount":100`), "po-2", "po/2", 1), "id", 400},
		{"unknown field", "/v1/payouts", payout(`"amount":100,"priority":1`), "priority", 400},
		{"missing beneficiary", "/v1/payouts", strings.Replace(payout(`"amount":100`), `"b"`, `""`, 1), "beneficiary_ref", 400},
		{"nul in beneficiary", "/v1/payouts", strings.Replace(payout(`"amount":100`), `"b"`, `"a\u0000b"`, 1), "beneficiary_ref", 400},
		{"account negative opening", "/v1/accounts", `{"id":"acc-2","currency":"EUR","opening_balance":-1}`, "opening_balance", 400},
		{"account wrong currency", "/v1/accounts", `{"id":"acc-2","currency":"GBP","opening_balance":1}`, "currency", 400},
		{"missing token", "/v1/payouts/po-1/outcome", `{"holder":"h","outcome":"ACKED"}`, "token", 400},
		{"zero token", "/v1/payouts/po-1/outcome", `{"token":0,"holder":"h","outcome":"ACKED"}`, "token", 400},
		{"negative token", "/v1/payouts/po-1/outcome", `{"token":-4,"holder":"h","outcome":"ACKED"}`, "token", 400},
		{"missing holder", "/v1/payouts/po-1/outcome", `{"token":4,"outcome":"ACKED"}`, "holder", 400},
		{"acked without rail_ref", "/v1/payouts/po-1/outcome", `{"token":4,"holder":"h","outcome":"ACKED"}`, "rail_ref", 400},
		{"acked with a blank rail_ref", "/v1/payouts/po-1/outcome", `{"token":4,"holder":"h","outcome":"ACKED","rail_ref":" "}`, "rail_ref", 400},
		{"bad outcome", "/v1/payouts/po-1/outcome", `{"token":4,"holder":"h","outcome":"MAYBE"}`, "outcome", 400},
		{"missing evidence", "/v1/payouts/po-1/resolve", `{"token":4,"holder":"h","resolution":"SETTLED"}`, "evidence", 400},
		{"blank reason", "/v1/payouts/po-1/abandon", `{"token":4,"holder":"h","reason":"  "}`, "reason", 400},
		{"empty body", "/v1/payouts/po-1/post", ``, "body", 400},
		{"trailing data", "/v1/payouts/po-1/post", `{"token":4,"holder":"h"}{}`, "after", 400},
		{"bad limit", "/v1/ledger?limit=0", ``, "limit", 400},
	}
	before := e.counts(t)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			method := http.MethodPost
			if strings.HasPrefix(c.path, "/v1/ledger") {
				method = http.MethodGet
			}
			req, _ := http.NewRequest(method, e.url+c.path, bytes.NewBufferString(c.body))
			req.Header.Set("Authorization", "Bearer "+operatorBearer)
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.status || resp.Header.Get("Content-Type") != problem.ContentType {
				t.Fatalf("status %d (%s), want %d problem: %s", resp.StatusCode, resp.Header.Get("Content-Type"), c.status, body)
			}
			if !strings.Contains(string(body), c.field) {
				t.Fatalf("problem does not name %q: %s", c.field, body)
			}
		})
	}
	if after := e.counts(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Fatalf("bad input wrote rows: %v -> %v", before, after)
	}
	if a, _ := e.exec.Account(bg, "acc-1"); a.FenceToken != 4 {
		t.Fatalf("bad input moved the fence: %+v", a)
	}
}

// TestEscapedPathIDs: an id sent percent-escaped (po%2D1, acc%2D1, as some
// clients escape every byte they are unsure of) names the same payout or
// account; an escaped byte no id may hold is still not found.
func TestEscapedPathIDs(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 100)
	for path, want := range map[string]int{
		"/v1/payouts/po%2D1":        http.StatusOK,
		"/v1/payouts/po%2d1/events": http.StatusOK,
		"/v1/accounts/acc%2D1":      http.StatusOK,
		"/v1/payouts/po%2F1":        http.StatusNotFound,
		"/v1/payouts/po%3A1":        http.StatusNotFound,
	} {
		if got := e.getStatus(t, path, operatorBearer); got != want {
			t.Errorf("GET %s: %d, want %d", path, got, want)
		}
	}
}

// TestFundingAtItsLimitRefusesAnOpeningBalance: the funding account's
// balance is the negated sum of every opening balance and is a bigint;
// an opening balance that would take it below -2^63 is a 409 naming the
// cause that creates nothing (it was a 500: bigint out of range).
func TestFundingAtItsLimitRefusesAnOpeningBalance(t *testing.T) {
	t.Parallel()
	e := setup(t)
	if _, err := e.svc.pool.Exec(bg, `UPDATE account SET balance = -9223372036854775000 WHERE id = $1`, pc.FundingAccount); err != nil {
		t.Fatal(err)
	}
	_, err := e.oper.CreateAccount(bg, pc.CreateAccountRequest{ID: "acc-big", Currency: "EUR", OpeningBalance: 999_999_999_999_999})
	wantCode(t, err, problem.Conflict)
	if !strings.Contains(err.Error(), "funding") {
		t.Fatalf("the refusal does not name the funding account: %v", err)
	}
	_, err = e.exec.Account(bg, "acc-big")
	wantCode(t, err, problem.NotFound)
	// Accounts that do not move funding are still created.
	if a := e.account(t, "acc-zero", 0); a.Balance != 0 {
		t.Fatalf("zero-opening account %+v", a)
	}
}

// TestRefusableTransitionsExportedAtZero: every (state, event) the
// transition table refuses is on /metrics at 0 before the first refusal,
// so the first one after a start is an increase PayoutsRejectedTransition
// sees (a series born at 1 is no increase); accepted pairs are not there.
func TestRefusableTransitionsExportedAtZero(t *testing.T) {
	t.Parallel()
	e := setup(t)
	got := map[string]float64{}
	mfs, err := e.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "payouts_payment_rejected_transitions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var st, ev string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "state":
					st = l.GetValue()
				case "event":
					ev = l.GetValue()
				}
			}
			got[st+"/"+ev] = m.GetCounter().GetValue()
		}
	}
	for _, k := range []string{"PENDING/submitting", "POSTED/claim", "FAILED/post"} {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("rejected transition %s: %v (present %v), want exported at 0", k, v, ok)
		}
	}
	if _, ok := got["PENDING/claim"]; ok {
		t.Error("an accepted transition (PENDING/claim) is exported as refusable")
	}
}

// Replays of one account's creation that run at once (a lost answer sent
// again while the first is still running, two loaders overlapping) are
// idempotent: one creates it, the others answer the account, none fails on
// the account's second unique index.
func TestConcurrentReplaysOfAnAccountCreateItOnce(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := tctx(t)
	const ids, callers, opening = 60, 6, 100
	for i := range ids {
		id := fmt.Sprintf("acc-%d", i)
		var wg sync.WaitGroup
		var created atomic.Int32
		errs := make(chan error, callers)
		for range callers {
			wg.Go(func() {
				a, c, err := e.svc.CreateAccount(ctx, pc.CreateAccountRequest{ID: id, Currency: "EUR", OpeningBalance: opening})
				if err != nil {
					errs <- err
					return
				}
				if a.ID != id || a.Balance != opening {
					errs <- fmt.Errorf("answered %+v", a)
				}
				if c {
					created.Add(1)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("%s: %v", id, err)
		}
		if n := created.Load(); n != 1 {
			t.Errorf("%s: created by %d calls, want 1", id, n)
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	if f, err := e.exec.Account(bg, pc.FundingAccount); err != nil || f.Balance != -ids*opening {
		t.Fatalf("funding %+v %v, want balance %d", f, err, -ids*opening)
	}
	e.assertLedger(t)
}
