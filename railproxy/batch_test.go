package railproxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

func batchItems(account string, ids ...string) []proxyclient.BatchItem {
	out := make([]proxyclient.BatchItem, len(ids))
	for i, id := range ids {
		s := sub(id, account)
		out[i] = proxyclient.BatchItem{PayoutID: s.PayoutID, ClientRef: s.ClientRef, Amount: s.Amount, Currency: s.Currency, BeneficiaryRef: s.BeneficiaryRef}
	}
	return out
}

func countKind(evs []proxyclient.SafetyEvent, kind string) int {
	n := 0
	for _, e := range evs {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// Each item of an accepted batch is answered as its single submission
// would be, in order: an already forwarded payout gets submission_exists
// with the existing record and duplicate_attempt evidence, and is not sent
// again; the others are forwarded once and carry the rail's outcome.
func TestBatchMixedItems(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	if _, err := b.pc.Submit(ctx, sub("p-1", "acc-m"), 3, holder(1)); err != nil {
		t.Fatal(err)
	}
	items := batchItems("acc-m", "p-1", "p-2", "p-3")
	items[2].BeneficiaryRef = railclient.DefaultDeclinePrefix + "p-3"
	res, err := b.pc.SubmitBatch(ctx, "acc-m", 4, holder(1), items)
	if err != nil || len(res) != 3 {
		t.Fatalf("batch: %+v %v, want 3 items", res, err)
	}
	if res[0].Err == nil || res[0].Err.Code != problem.SubmissionExists || res[0].PayoutID != "p-1" {
		t.Fatalf("item 0: %+v, want submission_exists for p-1", res[0])
	}
	existing, ok := proxyclient.ExistingRecord(res[0].Err)
	if !ok || existing.PayoutID != "p-1" || existing.FenceToken != 3 {
		t.Fatalf("item 0's existing record: %+v %v, want p-1's at token 3", existing, ok)
	}
	if res[1].Err != nil || res[1].Record.PayoutID != "p-2" || res[1].Record.Outcome != proxyclient.OutcomeAcked || res[1].Record.FenceToken != 4 {
		t.Fatalf("item 1: %+v, want p-2 ACKED at token 4", res[1])
	}
	if res[2].Err != nil || res[2].PayoutID != "p-3" || res[2].Record.Outcome != proxyclient.OutcomeRejected {
		t.Fatalf("item 2: %+v, want p-3 REJECTED", res[2])
	}
	for _, id := range []string{"p-1", "p-2", "p-3"} {
		if got := b.atRail(t, "po-"+id); len(got) != 1 {
			t.Fatalf("%s at the rail: %d payments, want 1", id, len(got))
		}
	}
	if n := countKind(b.safetyEvents(t), proxyclient.KindDuplicateAttempt); n != 1 {
		t.Fatalf("duplicate_attempt events: %d, want 1", n)
	}
	// A batch whose every item is already forwarded writes nothing, the
	// high-water mark included.
	res, err = b.pc.SubmitBatch(ctx, "acc-m", 7, holder(1), batchItems("acc-m", "p-2"))
	if err != nil || len(res) != 1 || res[0].Err == nil || res[0].Err.Code != problem.SubmissionExists {
		t.Fatalf("all-duplicate batch: %+v %v", res, err)
	}
	if hw, _ := b.highWater(t, "acc-m"); hw.Token != 4 {
		t.Fatalf("high-water after an all-duplicate batch: %d, want 4 (rolled back)", hw.Token)
	}
}

// Input a batch can never be accepted with is refused whole, before
// anything is written or forwarded: 400 invalid_request, forwarded false,
// the offending item named.
func TestBatchBadInputIs4xx(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	tooMany := make([]string, proxyclient.MaxBatchItems+1)
	for i := range tooMany {
		tooMany[i] = fmt.Sprintf("p-%d", i)
	}
	badRef := batchItems("acc-b", "p-1", "p-2")
	badRef[1].ClientRef = "po-p-1"
	twice := batchItems("acc-b", "p-1", "p-1")
	for name, tc := range map[string]struct {
		items []proxyclient.BatchItem
		token int64
		field string
	}{
		"empty":      {nil, 5, "items"},
		"too many":   {batchItems("acc-b", tooMany...), 5, "items"},
		"client_ref": {badRef, 5, "items[1].client_ref"},
		"twice":      {twice, 5, "items[1].payout_id"},
		"no token":   {batchItems("acc-b", "p-1"), 0, "token"},
	} {
		_, err := b.pc.SubmitBatch(ctx, "acc-b", fencing.Token(tc.token), holder(1), tc.items)
		var field string
		if !proxyclient.RefusedUnforwarded(err) || !problem.From(err).Extension("field", &field) || field != tc.field {
			t.Errorf("%s: %v (field %q), want invalid_request, forwarded false, field %q", name, err, field, tc.field)
		}
	}
	for _, body := range []string{`{`, `{"token":5,"holder":"h","items":[{"payout_id":"p-1","amount":"x"}]}`} {
		if code, raw := postRaw(t, b.url+"/v1/accounts/acc-b/submissions", body); code != http.StatusBadRequest || !strings.Contains(raw, `"forwarded":false`) {
			t.Errorf("body %s: %d %s, want 400 with forwarded false", body, code, raw)
		}
	}
	if code, raw := postRaw(t, b.url+"/v1/accounts/a%00b/submissions", `{}`); code != http.StatusBadRequest {
		t.Errorf("malformed account: %d %s, want 400", code, raw)
	}
	if p, err := b.pc.List(ctx, "", 0); err != nil || len(p.Items) != 0 {
		t.Fatalf("submissions after refused batches: %+v %v", p, err)
	}
	if h, ok := b.highWater(t, "acc-b"); ok {
		t.Fatalf("a refused batch moved the high-water mark: %+v", h)
	}
}

// Only an executor submits a batch.
func TestOnlyExecutorsSubmitBatches(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	for name, bearer := range map[string]string{"reconciler": reconcilerBearer, "operator": operatorBearer, "proxy": proxyBearer} {
		c, err := proxyclient.New(b.url, bearer)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.SubmitBatch(ctx, "acc-r", 9, "x", batchItems("acc-r", "evil-"+name)); !problem.Has(err, problem.Forbidden) {
			t.Errorf("%s submitting a batch: %v, want forbidden", name, err)
		}
	}
	if h, ok := b.highWater(t, "acc-r"); ok {
		t.Fatalf("a refused caller moved the high-water mark: %+v", h)
	}
	if res, err := b.pc.SubmitBatch(ctx, "acc-r", 9, holder(1), batchItems("acc-r", "p-ok")); err != nil || len(res) != 1 || res[0].Err != nil {
		t.Fatalf("the executor submitting a batch: %+v %v", res, err)
	}
}

// As for a single submission, once a batch's intents are committed the
// caller going away does not stop their forwarding: the proxy finishes
// each rail call and records its outcome.
func TestBatchForwardingIsDetachedFromTheCaller(t *testing.T) {
	t.Parallel()
	// The rail holds the batch's first call until freed: the caller goes
	// away only once the intents are committed (one transaction) and
	// forwarding is under way, however slow the machine.
	railURL, entered, free := heldRail(t, &fakeClock{t: time.Now()}, http.MethodPost)
	b := setup(t, options{railURL: railURL})
	leaveWhileTheRailHolds(t, entered, func(ctx context.Context) error {
		_, err := b.pc.SubmitBatch(ctx, "acc-bd", 3, holder(3), batchItems("acc-bd", "p-d1", "p-d2"))
		return err
	})
	free()
	for _, id := range []string{"p-d1", "p-d2"} {
		eventually(t, "the outcome of "+id+" is recorded", func() (bool, error) {
			rec, err := b.pc.Get(ctxFor(t), id)
			if problem.Has(err, problem.NotFound) {
				return false, nil
			}
			return rec.Outcome == proxyclient.OutcomeAcked, err
		})
		if got := b.atRail(t, "po-"+id); len(got) != 1 {
			t.Fatalf("rail holds %d payments for %s, want 1", len(got), id)
		}
	}
}
