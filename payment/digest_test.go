package payment

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// GET /payout-digests pages through every payout in byte order of its id,
// each with the tokens of its history in event order, exactly once.
func TestPayoutDigestsPageInByteOrderWithHistoryTokens(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	// Byte order: "-" < "." < digits < upper case < "_" < lower case.
	ids := []string{"po_b", "po-2", "poA", "po.1", "po-10", "pa"}
	for _, id := range ids {
		e.payout(t, id, "acc-1", 10)
	}
	e.drive(t, "po-2", pc.RailSubmitted, 7, "holder-a")
	e.drive(t, "po-10", pc.Posted, 8, "holder-b")
	want := slices.Clone(ids)
	slices.Sort(want)

	var got []string
	tokens := map[string][]int64{}
	ledger := map[string]pc.LedgerDigest{}
	after := ""
	for pages := 0; ; pages++ {
		if pages > len(ids) {
			t.Fatalf("paging does not end: %v", got)
		}
		page, err := e.recon.PayoutDigests(tctx(t), after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range page.Items {
			got = append(got, d.ID)
			tokens[d.ID] = d.EventTokens
			if d.Ledger == nil {
				t.Fatalf("digest of %s carries no ledger sums", d.ID)
			}
			ledger[d.ID] = *d.Ledger
			if d.ClientRef != pc.ClientRef(d.ID) || d.AccountID != "acc-1" || d.Amount != 10 || d.Currency == "" || d.CreatedAt.IsZero() {
				t.Errorf("digest %+v does not carry the payout", d)
			}
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if !slices.Equal(got, want) {
		t.Fatalf("digests in order %v, want %v", got, want)
	}
	// Created (no token), then claimed and submitting under token 7.
	if tk := tokens["po-2"]; !slices.Equal(tk, []int64{0, 7, 7}) {
		t.Errorf("po-2 history tokens = %v, want [0 7 7]", tk)
	}
	if tk := tokens["pa"]; !slices.Equal(tk, []int64{0}) {
		t.Errorf("pa history tokens = %v, want [0]", tk)
	}
	// The posted payout carries its posting; the others none.
	for _, id := range ids {
		l := ledger[id]
		if id == "po-10" {
			if !l.Posted(10) {
				t.Errorf("ledger sums of POSTED po-10 = %+v, want its posting of 10", l)
			}
		} else if l != (pc.LedgerDigest{}) {
			t.Errorf("ledger sums of unposted %s = %+v, want none", id, l)
		}
	}
}

// Malformed paging input is a 4xx, never a 5xx.
func TestPayoutDigestsRefuseBadQuery(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, q := range []string{"limit=0", "limit=10001", "limit=x", "after=%20bad", "after=a/b", "state=POSTED"} {
		if code := e.getStatus(t, "/v1/payout-digests?"+q, reconcilerBearer); code != http.StatusBadRequest {
			t.Errorf("GET /v1/payout-digests?%s: %d, want 400", q, code)
		}
	}
}

// The digest page reads payouts and their events through the byte-order
// indexes (migration 00004), never by walking either table.
func TestPayoutDigestsUseByteOrderIndexes(t *testing.T) {
	t.Parallel()
	e := setup(t)
	plan := explainGeneric(t, e.svc.pool, "", payoutDigestsSQL, "'', 5000, 'payout-clearing'", genericPlans...)
	if !strings.Contains(plan, "payout_id_bytes_idx") || !strings.Contains(plan, "payout_event_digest_idx") ||
		!strings.Contains(plan, "ledger_entry_payout_idx") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("the digest page does not read through the byte-order indexes:\n%s", plan)
	}
}

// A digest's unset times are null, as every unset time in the API is, not
// left out.
func TestPayoutDigestsWriteUnsetTimesAsNull(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 10)
	req, err := http.NewRequestWithContext(tctx(t), http.MethodGet, e.url+"/v1/payout-digests", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+reconcilerBearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var page struct {
		Items []map[string]json.RawMessage `json:"items"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&page); err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 {
		t.Fatalf("%d digests, want 1", len(page.Items))
	}
	for _, f := range []string{"claimed_at", "submitted_at"} {
		if v, ok := page.Items[0][f]; !ok || string(v) != "null" {
			t.Errorf("%s of a PENDING payout's digest: %s (present: %v), want null", f, v, ok)
		}
	}
}

// GET /v1/terminal-exits lists the changes of payouts out of POSTED,
// FAILED or ABANDONED (a replay the transition table did not stop; forged
// into a history here), in id order, and nothing else; through the
// partial index of migration 00009, never by walking the events.
func TestTerminalExitsListOnlyChangesOutOfAFinalState(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	for _, id := range []string{"po-1", "po-2", "po-3"} {
		e.payout(t, id, "acc-1", 10)
	}
	e.drive(t, "po-1", pc.Posted, 7, "holder-a")
	e.drive(t, "po-2", pc.Posted, 8, "holder-a")
	if _, err := e.svc.pool.Exec(tctx(t), `INSERT INTO payout_event (payout_id, from_state, to_state, token, holder, actor, reason)
		VALUES ('po-2', 'POSTED', 'ABANDONED', 9, 'holder-c', 'cleanup-job', 'replayed')`); err != nil {
		t.Fatal(err)
	}
	page, err := e.recon.TerminalExits(tctx(t), 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Items) != 1 || page.Next != "" {
		t.Fatalf("terminal exits %+v (next %q), want the one forged change", page.Items, page.Next)
	}
	if ev := page.Items[0]; ev.PayoutID != "po-2" || ev.FromState != pc.Posted || ev.ToState != pc.Abandoned || ev.Token != 9 ||
		ev.Holder != "holder-c" || ev.Actor != "cleanup-job" || ev.Reason != "replayed" {
		t.Fatalf("terminal exit %+v, want po-2 POSTED -> ABANDONED under 9 by cleanup-job", ev)
	}
	if page, err = e.recon.TerminalExits(tctx(t), page.Items[0].ID, 10); err != nil || len(page.Items) != 0 {
		t.Fatalf("after the last one: %+v, %v; want none", page.Items, err)
	}
	plan := explainGeneric(t, e.svc.pool, "", terminalExitsSQL, "0, 100", genericPlans...)
	if !strings.Contains(plan, "payout_event_terminal_exit_idx") || strings.Contains(plan, "Seq Scan") {
		t.Errorf("terminal exits are not read through payout_event_terminal_exit_idx:\n%s", plan)
	}
}
