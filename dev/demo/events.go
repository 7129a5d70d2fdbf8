package demo

import (
	"context"
	"fmt"
	"slices"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// fenceEvent is a fenced_out safety event at either guard.
type fenceEvent struct {
	guard             string
	key               string
	presented, stored fencing.Token
	holder            fencing.Holder
	payoutID          string
}

// fencedEvents reads every fenced_out safety event from both guards.
func (dm *demo) fencedEvents(ctx context.Context) ([]fenceEvent, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var out []fenceEvent
	var after int64
	for {
		page, err := dm.pay.SafetyEvents(cctx, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("read the payment resource's safety events: %w", err)
		}
		for _, e := range page.Items {
			after = max(after, e.ID)
			if e.Kind == pc.KindFencedOut {
				out = append(out, fenceEvent{"payment", e.Key, e.PresentedToken, e.StoredToken, e.Holder, e.PayoutID})
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
	}
	cursor := ""
	for {
		page, err := dm.proxy.SafetyEvents(cctx, cursor, 1000)
		if err != nil {
			return nil, fmt.Errorf("read the proxy's safety events: %w", err)
		}
		for _, e := range page.Items {
			if e.Kind == proxyclient.KindFencedOut {
				out = append(out, fenceEvent{"proxy", e.Key, e.PresentedToken, e.StoredToken, e.Holder, e.PayoutID})
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		cursor = page.Next
	}
}

func (dm *demo) allFenced(ctx context.Context) []fenceEvent {
	evs, _ := dm.fencedEvents(ctx)
	return evs
}

// unfenced are the frozen holders no event refused at the guard their next
// write goes to.
func unfenced(evs []fenceEvent, frozen []stale) []stale {
	var out []stale
	for _, s := range frozen {
		if !slices.ContainsFunc(evs, func(e fenceEvent) bool {
			return e.guard == s.guard && e.key == s.key && e.presented == s.token && e.presented < e.stored
		}) {
			out = append(out, s)
		}
	}
	return out
}

// staleFences are the events that refused a frozen holder's token.
func staleFences(evs []fenceEvent, frozen []stale) []fenceEvent {
	var out []fenceEvent
	for _, e := range evs {
		for _, s := range frozen {
			if e.key == s.key && e.presented == s.token && e.presented < e.stored {
				out = append(out, e)
				break
			}
		}
	}
	return out
}
