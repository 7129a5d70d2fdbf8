package reconcile_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/reconcile"
)

// postingBy plants a balanced posting group of amount for payout id on
// account under token, and moves both balances with it, as the payment
// resource's posting does: every other check (group sums, balances,
// grants, token order) stays quiet, so only the match of postings to
// payouts can tell.
func (e *testBundle) postingBy(t *testing.T, group, id, account string, amount int64, token int64) {
	t.Helper()
	e.exec(t, "paydb", true, `WITH l AS (
			INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id, payout_id, token)
			VALUES ($1, $2, -$4::bigint, $3, $5, $6), ($1, $3, $4, $2, $5, $6)
		), a AS (UPDATE account SET balance = balance - $4 WHERE id = $2)
		UPDATE account SET balance = balance + $4 WHERE id = $3`, group, account, pc.ClearingAccount, amount, id, token)
}

// Every POSTED payout's ledger holds exactly its posting, and no other
// payout has any: a second posting of a paid payout (the customer debited
// twice, the rail paid once), a POSTED payout without its entries, and a
// FAILED payout carrying a posting under a real grant (debited, nothing
// paid) are each a payout_posting finding (INV-03). Each ledger group
// sums to zero and each balance is its entries' sum, so nothing else
// reported them before; a payout posted correctly is not reported.
func TestPostingsAreMatchedToTheirPayouts(t *testing.T) {
	t.Parallel()
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	good := e.payOut(t, e.newPayout(t, acc, 70))

	twice := e.payOut(t, e.newPayout(t, acc, 100))
	e.postingBy(t, "replay:"+twice.ID, twice.ID, acc, 100, int64(twice.Token))

	bare := e.newPayout(t, acc, 40)
	g := e.grant(t, acc)
	if got, _ := e.submit(t, bare, g); got.State != pc.RailAcked {
		t.Fatalf("payout %s is %s, want RAIL_ACKED", bare.ID, got.State)
	}
	e.release(t, g)
	e.exec(t, "paydb", true, `UPDATE payout SET state = 'POSTED', settled_at = now() WHERE id = $1`, bare.ID)

	failed := e.newPayout(t, acc, 30)
	g = e.grant(t, acc)
	e.release(t, g)
	e.exec(t, "paydb", true, `UPDATE payout SET state = 'FAILED', failure_reason = 'planted' WHERE id = $1`, failed.ID)
	e.postingBy(t, "post:"+failed.ID, failed.ID, acc, 30, int64(g.Token))

	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	for _, c := range []struct {
		id   string
		want map[string]any
	}{
		{twice.ID, map[string]any{"state": "POSTED", "entries": 4, "groups": 2, "account_sum": -200, "clearing_sum": 200}},
		{bare.ID, map[string]any{"state": "POSTED", "entries": 0, "account_sum": 0}},
		{failed.ID, map[string]any{"state": "FAILED", "entries": 2, "account_sum": -30, "clearing_sum": 30}},
	} {
		c.want["payout_id"], c.want["account_id"] = c.id, acc
		mustFind(t, rep, reconcile.INV03, reconcile.CheckPayoutPosting, c.want)
	}
	mustNotFind(t, rep, reconcile.CheckPayoutPosting, map[string]any{"payout_id": good.ID})
	for _, f := range rep.Findings {
		if (f.Check == reconcile.CheckLedgerGroupSum || f.Check == reconcile.CheckBalanceDrift) && fmt.Sprint(f.Objects["account_id"]) == acc {
			t.Errorf("the planted postings balance, yet %s reported %v", f.Check, f.Objects)
		}
	}
}

// Money moved through payout-clearing by a group that names no payout is
// a payout_posting finding: only a payout's posting credits clearing.
func TestClearingEntryWithoutAPayoutIsReported(t *testing.T) {
	t.Parallel()
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	group := uniq("sweep")
	e.exec(t, "paydb", true, `WITH l AS (
			INSERT INTO ledger_entry (group_id, account_id, amount, counterparty_account_id)
			VALUES ($1, $2, -55, $3), ($1, $3, 55, $2)
		), a AS (UPDATE account SET balance = balance - 55 WHERE id = $2)
		UPDATE account SET balance = balance + 55 WHERE id = $3`, group, acc, pc.ClearingAccount)
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	mustFind(t, rep, reconcile.INV03, reconcile.CheckPayoutPosting, map[string]any{"group_id": group, "account_id": pc.ClearingAccount, "amount": 55})
}

// A payment resource older than the digests' ledger sums answers without
// them: the reconciler says in a note that postings were not matched,
// rather than reporting every POSTED payout as unposted.
func TestDigestsWithoutLedgerSumsAreNotedNotReported(t *testing.T) {
	t.Parallel()
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	p := e.payOut(t, e.newPayout(t, acc, 25))
	target, err := url.Parse(e.st.Ready.PaymentURL)
	if err != nil {
		t.Fatal(err)
	}
	old := httputil.NewSingleHostReverseProxy(target)
	old.ModifyResponse = func(r *http.Response) error {
		if r.Request.URL.Path != "/v1/payout-digests" || r.StatusCode != http.StatusOK {
			return nil
		}
		var page map[string]any
		if err := json.NewDecoder(r.Body).Decode(&page); err != nil {
			return err
		}
		items, _ := page["items"].([]any)
		for _, it := range items {
			delete(it.(map[string]any), "ledger")
		}
		b, err := json.Marshal(page)
		if err != nil {
			return err
		}
		r.Body = io.NopCloser(bytes.NewReader(b))
		r.ContentLength = int64(len(b))
		r.Header.Set("Content-Length", strconv.Itoa(len(b)))
		return nil
	}
	srv := httptest.NewServer(old)
	t.Cleanup(srv.Close)
	rep := pass(t, e.reconcilerAt(t, reconcile.Options{}, e.st.Ready.Tokens.Operator, nil, srv.URL))
	mustNotFind(t, rep, reconcile.CheckPayoutPosting, map[string]any{"payout_id": p.ID})
	noted := false
	for _, n := range rep.Notes {
		noted = noted || (strings.Contains(n, "without their ledger sums") && strings.Contains(n, reconcile.CheckPayoutPosting))
	}
	if !noted {
		t.Fatalf("no note that postings were not matched; notes: %q", rep.Notes)
	}
}

// A FAILED payout whose forwarded submission the rail may have paid (no
// outcome or TIMEOUT, and no resolution) is a submission_state_mismatch:
// FAILED releases the payout's money, and with a forwarded submission it
// is reached only after the rail declined it (REJECTED) or a lookup found
// nothing (ABSENT), both recorded at the proxy first. Those two are not
// reported.
func TestFailedPayoutTheRailMayHavePaidIsReported(t *testing.T) {
	t.Parallel()
	e := setup(t)
	acc := e.newAccount(t, 10_000)
	g := e.grant(t, acc)
	e.release(t, g)
	plant := func(outcome, resolution string) pc.Payout {
		t.Helper()
		p := e.newPayout(t, acc, 100)
		e.exec(t, "proxydb", false, `INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref,
				outcome, outcome_at, resolution, resolution_at, resolution_evidence)
			VALUES ($1, $2, $3, $4, $5, $6, 'EUR', $7, NULLIF($8, ''), CASE WHEN $8 = '' THEN NULL ELSE now() END,
				NULLIF($9, ''), CASE WHEN $9 = '' THEN NULL ELSE now() END, CASE WHEN $9 = '' THEN NULL ELSE 'planted' END)`,
			p.ID, acc, int64(g.Token), g.SessionID, p.ClientRef, p.Amount, p.BeneficiaryRef, outcome, resolution)
		e.exec(t, "paydb", true, `UPDATE payout SET state = 'FAILED', failure_reason = 'planted' WHERE id = $1`, p.ID)
		return p
	}
	timedOut, noOutcome := plant("TIMEOUT", ""), plant("", "")
	declined, absent := plant("REJECTED", ""), plant("TIMEOUT", "ABSENT")
	rep := pass(t, e.reconciler(t, reconcile.Options{}, e.st.Ready.Tokens.Operator))
	for _, p := range []pc.Payout{timedOut, noOutcome} {
		mustFind(t, rep, reconcile.INV03, reconcile.CheckSubmissionStateMismatch, map[string]any{"payout_id": p.ID, "state": "FAILED"})
	}
	for _, p := range []pc.Payout{declined, absent} {
		mustNotFind(t, rep, reconcile.CheckSubmissionStateMismatch, map[string]any{"payout_id": p.ID})
	}
}
