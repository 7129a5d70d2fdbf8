package reconcile

import (
	"context"
	"sync"

	"github.com/payouts/payouts/rail/railclient"
)

// ---- the rail's payments, by client reference ----

// railIndex answers "which rail payments carry this client reference".
// With the settlement report it is a map (the rail serves the report in one
// piece); without it, it asks the rail per reference.
type railIndex struct {
	rail   *railclient.Client
	byRef  map[string][]railclient.Payment // nil: ask per reference
	orphan map[string]bool                 // client refs not yet matched to a payout
	mu     sync.Mutex                      // guards orphan: payouts are checked concurrently
}

func (r *Reconciler) loadRail(ctx context.Context, rep *Report) (*railIndex, error) {
	ri := &railIndex{rail: r.c.Rail}
	if r.opts.RailPerPayout {
		rep.note("rail payments were looked up per payout (--rail-per-payout); payments carrying no known client reference were not checked")
		return ri, nil
	}
	items, err := r.c.RailReport.SettlementReport(ctx)
	switch {
	case isForbidden(err):
		rep.note("the rail refused this token its settlement report; rail payments were looked up per payout, and payments carrying no known client reference were not checked (give --rail-report-token-file: an operator-role token of the rail)")
		r.log.Warn("rail settlement report forbidden; checking rail payments per payout only", "check", CheckRailWithoutSubmission)
		return ri, nil
	case err != nil:
		return nil, cannotRun("read the rail's settlement report", err)
	}
	ri.byRef = map[string][]railclient.Payment{}
	ri.orphan = map[string]bool{}
	for _, p := range items {
		rep.Scanned.RailPayments++
		ri.byRef[p.ClientRef] = append(ri.byRef[p.ClientRef], p)
		ri.orphan[p.ClientRef] = true
	}
	return ri, nil
}

func (ri *railIndex) find(ctx context.Context, clientRef string) ([]railclient.Payment, error) {
	if ri.byRef != nil {
		ri.mu.Lock()
		delete(ri.orphan, clientRef)
		ri.mu.Unlock()
		return ri.byRef[clientRef], nil
	}
	l, err := ri.rail.Find(ctx, clientRef)
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}

// fresh asks the rail now, whatever the index holds.
func (ri *railIndex) fresh(ctx context.Context, clientRef string) ([]railclient.Payment, error) {
	l, err := ri.rail.Find(ctx, clientRef)
	if err != nil {
		return nil, err
	}
	return l.Items, nil
}
