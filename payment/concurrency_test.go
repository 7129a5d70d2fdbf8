package payment

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// TestConcurrentMutations races 50 goroutines sending random mutations with
// random (mostly rising, often stale) tokens at the payouts of one account. Afterwards the account's
// payout_event history, in commit order, has non-decreasing tokens (an equal
// token always from the same holder): no write landed below the fence as it
// stood when the write landed. Every refusal is fenced_out or
// invalid_transition, never anything else.
func TestConcurrentMutations(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const (
		workers      = 50
		perGoroutine = 12
		payouts      = 40
	)
	e.account(t, "acc-1", 1_000_000)
	for i := range payouts {
		e.payout(t, fmt.Sprintf("po-%d", i), "acc-1", 1_000)
	}
	var accepted, fenced, rejected, clock atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, 7))
			for range perGoroutine {
				// Mostly fresh tokens, some a few grants old, all racing.
				tok := fencing.Token(max(1, clock.Add(1)-int64(r.IntN(6))))
				holder := fencing.Holder(fmt.Sprintf("h-%d", tok))
				if r.IntN(10) == 0 {
					holder = "rogue" // an equal token from another holder
				}
				id := fmt.Sprintf("po-%d", r.IntN(payouts))
				rq := requests[r.IntN(len(requests))]
				if r.IntN(4) != 0 {
					// Mostly a request the payout's (racily read) state accepts.
					if p, err := e.exec.Payout(bg, id); err == nil {
						var fit []request
						for _, c := range requests {
							if _, ok := want[p.State][c.event]; ok {
								fit = append(fit, c)
							}
						}
						if len(fit) > 0 {
							rq = fit[r.IntN(len(fit))]
						}
					}
				}
				_, err := rq.do(e, id, tok, holder)
				switch {
				case err == nil:
					accepted.Add(1)
				case problem.Has(err, problem.FencedOut):
					fenced.Add(1)
				case problem.Has(err, problem.InvalidTransition):
					rejected.Add(1)
				default:
					errs <- fmt.Errorf("%s token %d: %w", rq.name, tok, err)
					return
				}
			}
		}(uint64(w))
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	t.Logf("accepted %d, fenced out %d, rejected transitions %d", accepted.Load(), fenced.Load(), rejected.Load())
	if accepted.Load() == 0 || fenced.Load() == 0 {
		t.Fatalf("the race exercised too little: accepted %d, fenced %d", accepted.Load(), fenced.Load())
	}

	rows, err := e.svc.pool.Query(tctx(t), `SELECT ev.id, ev.token, ev.holder FROM payout_event ev
		JOIN payout p ON p.id = ev.payout_id WHERE p.account_id = 'acc-1' AND ev.token IS NOT NULL ORDER BY ev.id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var fence int64
	var fenceHolder string
	var n int64
	for rows.Next() {
		var id, tok int64
		var holder string
		if err := rows.Scan(&id, &tok, &holder); err != nil {
			t.Fatal(err)
		}
		n++
		if tok < fence || (tok == fence && holder != fenceHolder) {
			t.Fatalf("event %d landed with (%d, %s) below the fence (%d, %s)", id, tok, holder, fence, fenceHolder)
		}
		fence, fenceHolder = tok, holder
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if n != accepted.Load() {
		t.Fatalf("%d fenced events recorded, %d requests accepted", n, accepted.Load())
	}
	a, err := e.exec.Account(bg, "acc-1")
	if err != nil {
		t.Fatal(err)
	}
	if int64(a.FenceToken) != fence || string(a.FenceHolder) != fenceHolder {
		t.Fatalf("account fence (%d, %s), last accepted (%d, %s)", a.FenceToken, a.FenceHolder, fence, fenceHolder)
	}
	e.assertLedger(t)
}
