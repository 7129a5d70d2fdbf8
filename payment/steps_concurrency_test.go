package payment

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestStepsRaceOtherWriters races POST /accounts/{id}/steps (claim+submitting,
// with and without while_covered; outcome, with and without post) against
// single claims and posts, on accounts whose funds cover fewer payouts than
// they have, under rising tokens drawn from one counter, some stale and some
// equal to the fence from another holder. Any answer the API allows is
// accepted. One more account takes only while-covered claims, its funds
// covering two of its payouts, so that the first such claim to pass its
// fence stops where the funds run out whatever the interleaving (on the
// others, plain claims may fail every uncovered payout first). Afterwards
// each account's fenced events have non-decreasing
// tokens and are exactly the transitions the answers reported, no account's
// available funds are negative, the ledger balances, each POSTED payout has
// its two ledger lines and no other payout any, every steps answer matches
// its request item for item, and every fenced_out answer left its evidence.
func TestStepsRaceOtherWriters(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const workers, perGoroutine, accounts, payouts = 16, 20, 3, 30
	for a := range accounts {
		acct := fmt.Sprintf("acc-%d", a)
		e.account(t, acct, 3_000) // the payouts total 6,000: funds run out
		for i := range payouts {
			e.payout(t, fmt.Sprintf("%s-po-%02d", acct, i), acct, int64(100+50*(i%5)))
		}
	}
	const fundsEnd = "acc-end" // while-covered claims only: funds for two payouts
	e.account(t, fundsEnd, 250)
	for i := range payouts {
		e.payout(t, fmt.Sprintf("%s-po-%02d", fundsEnd, i), fundsEnd, 100)
	}
	const ( // the kinds of request, /steps first
		kClaimSteps = iota
		kCoveredSteps
		kOutcomePost
		kOutcomeOnly
		kClaim
		kPost
		kinds
	)
	names := [kinds]string{"steps claim+submitting", "steps claim+submitting while covered", "steps outcome+post",
		"steps outcome", "claim", "post"}
	var accepted [kinds]atomic.Int64
	var fenced, regressions, events, waited, clock atomic.Int64
	pick := func(r *rand.Rand, acct string, n int, states ...pc.State) []pc.StepItem {
		var ids []string
		if l, err := e.exec.Payouts(bg, pc.PayoutFilter{AccountID: acct, States: states, Limit: 100}); err == nil {
			for _, p := range l.Items {
				ids = append(ids, p.ID)
			}
		}
		if len(ids) == 0 || r.IntN(5) == 0 { // now and then a payout in any state
			if id := fmt.Sprintf("%s-po-%02d", acct, r.IntN(payouts)); !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
		}
		r.Shuffle(len(ids), func(i, j int) { ids[i], ids[j] = ids[j], ids[i] })
		return items(ids[:min(n, len(ids))]...)
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 11))
			for range perGoroutine {
				acct := fmt.Sprintf("acc-%d", r.IntN(accounts))
				kind := r.IntN(kinds)
				if kind == kCoveredSteps && r.IntN(2) == 0 {
					acct = fundsEnd
				}
				req := pc.StepsRequest{Op: pc.StepClaim, Then: pc.StepSubmitting, WhileCovered: kind == kCoveredSteps}
				switch kind {
				case kClaimSteps, kCoveredSteps:
					n := 2 + r.IntN(3) // 2 to 4 items; while covered 4 to 8, to reach the funds' end
					if kind == kCoveredSteps {
						n += 2 + r.IntN(3)
					}
					req.Items = pick(r, acct, n, pc.Pending, pc.Claimed)
				case kOutcomePost, kOutcomeOnly:
					req = pc.StepsRequest{Op: pc.StepOutcome, Items: pick(r, acct, 1+r.IntN(3), pc.RailSubmitted)}
					if kind == kOutcomePost {
						req.Then = pc.StepPost
					}
					for i := range req.Items {
						req.Items[i].Outcome, req.Items[i].RailRef = pc.OutcomeAcked, "rail-"+req.Items[i].PayoutID
						if r.IntN(4) == 0 {
							req.Items[i].Outcome, req.Items[i].RailRef, req.Items[i].ErrorCode = pc.OutcomeRejected, "", "DECLINED"
						}
					}
				case kClaim:
					req.Items = pick(r, acct, 1, pc.Pending)
				case kPost:
					req.Items = pick(r, acct, 1, pc.RailAcked)
				}
				// A fresh token; now and then a stale one, or the fence's own
				// token from another holder (a token regression).
				tok := fencing.Token(clock.Add(1))
				holder := fencing.Holder(fmt.Sprintf("h-%d", tok))
				rogue := false
				switch r.IntN(10) {
				case 0:
					tok = fencing.Token(max(1, clock.Load()-5-int64(r.IntN(20))))
					holder = fencing.Holder(fmt.Sprintf("h-%d", tok))
				case 1:
					if a, err := e.exec.Account(bg, acct); err == nil && a.FenceToken > 0 {
						tok, holder, rogue = a.FenceToken, "rogue", true
					}
				}
				req.Token, req.Holder = tok, holder
				var res []pc.StepResult
				var err error
				if kind < kClaim {
					res, err = e.exec.PostSteps(bg, acct, req)
				} else {
					var p pc.Payout
					if kind == kClaim {
						p, err = e.exec.Claim(bg, req.Items[0].PayoutID, tok, holder)
					} else {
						p, err = e.exec.Post(bg, req.Items[0].PayoutID, tok, holder)
					}
					if err == nil {
						res = []pc.StepResult{{Payout: p, PayoutID: p.ID}}
					}
				}
				switch {
				case problem.Has(err, problem.FencedOut):
					fenced.Add(1)
					if rogue && problem.From(err).StoredToken == int64(tok) {
						regressions.Add(1) // refused by the very fence it repeated
					}
					continue
				case kind >= kClaim && (problem.Has(err, problem.InvalidTransition) || problem.Has(err, problem.InsufficientFunds)):
					continue
				case err != nil:
					t.Errorf("%s on %s under (%d, %s): %v", names[kind], acct, tok, holder, err)
					return
				}
				if len(res) != len(req.Items) {
					t.Errorf("%s: %d answers for %d items", names[kind], len(res), len(req.Items))
					return
				}
				moved := false
				for i, it := range res {
					id := req.Items[i].PayoutID
					if it.PayoutID != id || (it.Err == nil && it.Payout.ID != id) {
						t.Errorf("%s: answer %d is about %q/%q, want %q", names[kind], i, it.PayoutID, it.Payout.ID, id)
						return
					}
					if it.Err != nil {
						if it.Err.Code != problem.InvalidTransition {
							t.Errorf("%s: item %s: %v", names[kind], id, it.Err)
						}
						continue
					}
					// The transitions the item made: its payout_event rows.
					var n int64
					switch st := it.Payout.State; {
					case kind == kCoveredSteps && st == pc.Pending:
						waited.Add(1) // left as it stands: the funds ran out
						continue
					case kind <= kCoveredSteps && st == pc.RailSubmitted, kind == kOutcomePost && st == pc.Posted:
						n = 2
					case st == pc.Failed && kind != kPost, kind == kOutcomeOnly && st == pc.RailAcked,
						kind == kClaim && st == pc.Claimed, kind == kPost && st == pc.Posted:
						n = 1
					}
					if n == 0 || it.Payout.Token != tok {
						t.Errorf("%s under %d: item %s answered %s under token %d", names[kind], tok, id, it.Payout.State, it.Payout.Token)
						return
					}
					events.Add(n)
					moved = true
				}
				if moved {
					accepted[kind].Add(1)
				}
			}
		}(uint64(w))
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for k := range kinds {
		t.Logf("%s: %d accepted", names[k], accepted[k].Load())
		if accepted[k].Load() == 0 {
			t.Errorf("no %s request was accepted: the race exercised too little", names[k])
		}
	}
	t.Logf("fenced out %d (token regressions %d); items left waiting for funds %d", fenced.Load(), regressions.Load(), waited.Load())
	if fenced.Load() == 0 || waited.Load() == 0 {
		t.Error("no request was fenced out, or no claim stopped where the funds ran out: the race exercised too little")
	}

	// (1) Per account, the fenced events land in id order under
	// non-decreasing tokens (an equal token only from the same holder), and
	// they are exactly the transitions the answers reported.
	rows, err := e.svc.pool.Query(tctx(t), `SELECT p.account_id, ev.id, ev.token, ev.holder FROM payout_event ev
		JOIN payout p ON p.id = ev.payout_id WHERE ev.token IS NOT NULL ORDER BY ev.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close() // a failure below must not leave the pool waiting for it
	type fenceAt struct {
		tok    int64
		holder string
	}
	last := map[string]fenceAt{}
	var n int64
	for rows.Next() {
		var acct, holder string
		var id, tok int64
		if err := rows.Scan(&acct, &id, &tok, &holder); err != nil {
			t.Fatal(err)
		}
		n++
		if f := last[acct]; tok < f.tok || (tok == f.tok && holder != f.holder) {
			t.Fatalf("%s: event %d landed with (%d, %s) below the fence (%d, %s)", acct, id, tok, holder, f.tok, f.holder)
		}
		last[acct] = fenceAt{tok, holder}
	}
	if rows.Close(); rows.Err() != nil {
		t.Fatal(rows.Err())
	}
	if n != events.Load() {
		t.Fatalf("%d fenced events recorded, the answers reported %d transitions", n, events.Load())
	}
	for acct, f := range last {
		a, err := e.exec.Account(bg, acct)
		if err != nil || int64(a.FenceToken) != f.tok || string(a.FenceHolder) != f.holder || a.Available < 0 {
			t.Fatalf("%s: fence (%d, %s), available %d, %v; last event under (%d, %s)", acct, a.FenceToken, a.FenceHolder, a.Available, err, f.tok, f.holder)
		}
	}
	// (2) and (3): available >= 0 everywhere (D-7: balance less CLAIMED,
	// RAIL_SUBMITTED, RAIL_ACKED and RAIL_AMBIGUOUS payouts), the ledger
	// balances: every group sums to 0, every balance is its entries' sum.
	e.assertLedger(t)
	// (4) A POSTED payout has its two lines (debit the account, credit
	// payout-clearing, its amount each); any other payout none.
	var posted, bad int
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*) FILTER (WHERE p.state = 'POSTED'),
		count(*) FILTER (WHERE CASE WHEN p.state = 'POSTED' THEN NOT (l.n = 2 AND l.debit = 1 AND l.credit = 1) ELSE l.n <> 0 END)
		FROM payout p CROSS JOIN LATERAL (SELECT count(*) AS n,
			count(*) FILTER (WHERE e.account_id = p.account_id AND e.amount = -p.amount) AS debit,
			count(*) FILTER (WHERE e.account_id = 'payout-clearing' AND e.amount = p.amount) AS credit
			FROM ledger_entry e WHERE e.payout_id = p.id) l`).Scan(&posted, &bad); err != nil {
		t.Fatal(err)
	}
	if posted == 0 || bad != 0 {
		t.Fatalf("%d payouts POSTED, %d with ledger lines that do not match their state", posted, bad)
	}
	// (6) Every fenced_out answer left its evidence; every regression too.
	var fencedRows, regressionRows int64
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*) FILTER (WHERE kind = 'fenced_out'),
		count(*) FILTER (WHERE kind = 'token_regression') FROM safety_event`).Scan(&fencedRows, &regressionRows); err != nil {
		t.Fatal(err)
	}
	if fencedRows < fenced.Load() || regressionRows < regressions.Load() {
		t.Fatalf("%d fenced_out and %d token_regression rows for %d fenced-out answers, %d of them regressions",
			fencedRows, regressionRows, fenced.Load(), regressions.Load())
	}
}
