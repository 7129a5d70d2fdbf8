package payment

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

var opsFor = map[pc.State][]Op{
	pc.Pending: {OpClaim}, pc.Claimed: {OpSubmitting}, pc.RailSubmitted: {OpOutcome},
	pc.RailAcked: {OpPost}, pc.RailAmbiguous: {OpResolve, OpAbandon},
}

// TestLedgerInvariantsRapid runs random sequences of payout creations and
// fenced mutations — fresh, repeated, stale and re-issued tokens, in any
// state — and checks after every step: every ledger group sums to zero,
// every balance equals its entries, available >= 0, and the fence is the
// highest token accepted.
func TestLedgerInvariantsRapid(t *testing.T) {
	t.Parallel()
	e := setup(t)
	iter := 0
	rapid.Check(t, func(rt *rapid.T) {
		// A deadline per run, not one for the whole check: a loaded machine
		// slows every run, and the check makes a hundred of them.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		iter++
		acct := fmt.Sprintf("r%d", iter)
		opening := rapid.Int64Range(0, 20_000).Draw(rt, "opening")
		if _, _, err := e.svc.CreateAccount(ctx, pc.CreateAccountRequest{ID: acct, Currency: "EUR", OpeningBalance: opening}); err != nil {
			rt.Fatal(err)
		}
		var (
			ids    []string
			top    fencing.Token // highest accepted token
			holder fencing.Holder
		)
		apply := func(rt *rapid.T, id string, op Op, tok fencing.Token, h fencing.Holder, outcome pc.Outcome, resolution pc.Resolution) {
			cmd := Command{Op: op, Token: tok, Holder: h, Actor: "test", Text: "because", Outcome: outcome, Resolution: resolution}
			_, err := e.svc.Apply(ctx, id, cmd)
			switch {
			case err == nil:
				if tok < top || (tok == top && h != holder) {
					rt.Fatalf("accepted (%d, %s) below the fence (%d, %s)", tok, h, top, holder)
				}
				top, holder = tok, h
			case problem.Has(err, problem.FencedOut):
				if tok > top || (tok == top && h == holder) {
					rt.Fatalf("fenced out (%d, %s) above the fence (%d, %s)", tok, h, top, holder)
				}
			case problem.Has(err, problem.InvalidTransition):
			default:
				rt.Fatalf("%s: %v", op, err)
			}
		}
		rt.Repeat(map[string]func(*rapid.T){
			"create": func(rt *rapid.T) {
				id := fmt.Sprintf("%s-p%d", acct, len(ids))
				amount := rapid.Int64Range(1, 2_000).Draw(rt, "amount")
				if _, _, err := e.svc.CreatePayout(ctx, pc.CreatePayoutRequest{ID: id, AccountID: acct, Amount: amount, Currency: "EUR", BeneficiaryRef: "b"}, "test"); err != nil {
					rt.Fatal(err)
				}
				ids = append(ids, id)
			},
			"mutate": func(rt *rapid.T) {
				if len(ids) == 0 {
					rt.Skip("no payouts yet")
				}
				id := rapid.SampledFrom(ids).Draw(rt, "payout")
				op := rapid.SampledFrom(Ops).Draw(rt, "op")
				if rapid.IntRange(0, 4).Draw(rt, "fitting") > 0 {
					// Mostly an operation the payout's state accepts,
					// so sequences reach the ledger.
					p, err := e.svc.Payout(ctx, id)
					if err != nil {
						rt.Fatal(err)
					}
					if fit := opsFor[p.State]; len(fit) > 0 {
						op = rapid.SampledFrom(fit).Draw(rt, "fitting-op")
					}
				}
				tok, h := top+1, fencing.Holder(fmt.Sprintf("h%d", top+1))
				switch rapid.IntRange(0, 6).Draw(rt, "token") {
				case 1: // the current holder again
					if top > 0 {
						tok, h = top, holder
					}
				case 2: // stale
					if top > 1 {
						tok = fencing.Token(rapid.Int64Range(1, int64(top)-1).Draw(rt, "stale"))
					}
				case 3: // re-issued
					if top > 0 {
						tok, h = top, "someone-else"
					}
				}
				apply(rt, id, op, tok, h,
					rapid.SampledFrom([]pc.Outcome{pc.OutcomeAcked, pc.OutcomeAcked, pc.OutcomeRejected, pc.OutcomeTimeout}).Draw(rt, "outcome"),
					rapid.SampledFrom([]pc.Resolution{pc.ResolutionSettled, pc.ResolutionSettled, pc.ResolutionAbsent}).Draw(rt, "resolution"))
			},
			// advance walks one payout a step along the happy path under a
			// fresh grant, so sequences reach the ledger often.
			"advance": func(rt *rapid.T) {
				if len(ids) == 0 {
					rt.Skip("no payouts yet")
				}
				id := rapid.SampledFrom(ids).Draw(rt, "payout")
				p, err := e.svc.Payout(ctx, id)
				if err != nil {
					rt.Fatal(err)
				}
				fit := opsFor[p.State]
				if len(fit) == 0 {
					rt.Skip("terminal")
				}
				apply(rt, id, fit[0], top+1, fencing.Holder(fmt.Sprintf("h%d", top+1)), pc.OutcomeAcked, pc.ResolutionSettled)
			},
			"": func(rt *rapid.T) {
				rep, err := e.svc.CheckLedger(ctx, timeZero, []string{acct}, nil)
				if err != nil {
					rt.Fatal(err)
				}
				if !rep.Clean() {
					rt.Fatalf("ledger drift: %+v", rep)
				}
				a, err := e.svc.Account(ctx, acct)
				if err != nil {
					rt.Fatal(err)
				}
				if a.Available < 0 {
					rt.Fatalf("available %d < 0 (balance %d)", a.Available, a.Balance)
				}
				if a.FenceToken != top || a.FenceHolder != holder {
					rt.Fatalf("fence (%d, %s), model (%d, %s)", a.FenceToken, a.FenceHolder, top, holder)
				}
			},
		})
	})
	var posted int
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*) FROM payout WHERE state = 'POSTED'`).Scan(&posted); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d payouts posted across the runs", posted)
	if posted == 0 {
		t.Fatal("no sequence reached POSTED: the generator does not exercise the ledger")
	}
}
