package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// ---- safety events (INV-02, INV-04, INV-05, INV-08) ----

var kindCheck = map[string]string{
	pc.KindFencedOut:                 CheckFencedOut, // proxyclient.KindFencedOut is the same name
	pc.KindTokenRegression:           CheckTokenRegression,
	pc.KindRejectedTransition:        CheckRejectedTransition,
	proxyclient.KindDuplicateAttempt: CheckDuplicateAttempt,
}

type safetyEvent struct {
	guard                string
	id                   int64
	kind, key            string
	presented, stored    fencing.Token
	holder, storedHolder fencing.Holder
	payoutID, detail     string
	at                   time.Time
}

func (r *Reconciler) reportSafetyEvent(rep *Report, e safetyEvent) {
	rep.Scanned.SafetyEvents++
	check, ok := kindCheck[e.kind]
	if !ok {
		rep.note("%s safety event %d has unknown kind %q", e.guard, e.id, e.kind)
		return
	}
	objs := map[string]any{"guard": e.guard, "event_id": e.id, "kind": e.kind, "key": e.key,
		"presented_token": e.presented, "stored_token": e.stored, "holder": string(e.holder),
		"stored_holder": string(e.storedHolder), "payout_id": e.payoutID, "at": e.at.UTC()}
	var what string
	switch check {
	case CheckFencedOut:
		what = fmt.Sprintf("the %s guard fenced out token %d on %s (stored %d): a stale holder tried to write and was stopped", e.guard, e.presented, e.key, e.stored)
	case CheckTokenRegression:
		what = fmt.Sprintf("the %s guard saw token %d on %s from holder %s while it stores %d from %s: the lock service re-issued a token", e.guard, e.presented, e.key, e.holder, e.stored, e.storedHolder)
	case CheckRejectedTransition:
		what = fmt.Sprintf("the payment resource rejected a transition of payout %s: %s", e.payoutID, e.detail)
	case CheckDuplicateAttempt:
		what = fmt.Sprintf("the proxy refused a second submission of payout %s: %s", e.payoutID, e.detail)
	}
	if e.detail != "" && check != CheckRejectedTransition && check != CheckDuplicateAttempt {
		what += " (" + e.detail + ")"
	}
	rep.add(check, objs, "%s", what)
}

func (r *Reconciler) checkSafetyEvents(ctx context.Context, rep *Report) error {
	from := r.opts.SafetyEventsAfter
	rep.SafetyEventsSeen = from
	// Each guard's cursor is checked first: a log rewound below it would
	// otherwise hide every new event until the ids pass it again.
	for _, g := range []struct {
		guard      string
		proxy      bool
		id, seenID *int64
		at, seenAt *time.Time
	}{
		{"payment resource", false, &from.Payment, &rep.SafetyEventsSeen.Payment, &from.PaymentAt, &rep.SafetyEventsSeen.PaymentAt},
		{"rail proxy", true, &from.Proxy, &rep.SafetyEventsSeen.Proxy, &from.ProxyAt, &rep.SafetyEventsSeen.ProxyAt},
	} {
		rewound, at, err := cursorRewound(rep, g.guard, *g.id, *g.at, func(after int64) (eventMark, bool, error) {
			return r.firstEventAfter(ctx, g.proxy, after)
		})
		switch {
		case err != nil:
			return err
		case rewound:
			*g.id, *g.seenID, *g.at, *g.seenAt = 0, 0, time.Time{}, time.Time{}
		default:
			*g.seenAt = at // a state file written before the time was kept gets it now
		}
	}

	after := from.Payment
	for {
		page, err := r.c.Payment.SafetyEvents(ctx, after, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the payment resource's safety events", err)
		}
		for _, e := range page.Items {
			after = max(after, e.ID)
			if e.ID > rep.SafetyEventsSeen.Payment {
				rep.SafetyEventsSeen.Payment, rep.SafetyEventsSeen.PaymentAt = e.ID, e.At
			}
			r.reportSafetyEvent(rep, safetyEvent{guard: "payment", id: e.ID, kind: e.Kind, key: e.Key, presented: e.PresentedToken, stored: e.StoredToken,
				holder: e.Holder, storedHolder: e.StoredHolder, payoutID: e.PayoutID, detail: e.Detail, at: e.At})
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		if n, err := strconv.ParseInt(page.Next, 10, 64); err == nil && n > after {
			after = n
		}
	}
	cursor := ""
	if n := from.Proxy; n > 0 {
		cursor = strconv.FormatInt(n, 10)
	}
	for {
		page, err := r.c.Proxy.SafetyEvents(ctx, cursor, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the rail proxy's safety events", err)
		}
		for _, e := range page.Items {
			if e.ID > rep.SafetyEventsSeen.Proxy {
				rep.SafetyEventsSeen.Proxy, rep.SafetyEventsSeen.ProxyAt = e.ID, e.At
			}
			r.reportSafetyEvent(rep, safetyEvent{guard: "proxy", id: e.ID, kind: e.Kind, key: e.Key, presented: e.PresentedToken, stored: e.StoredToken,
				holder: e.Holder, storedHolder: e.StoredHolder, payoutID: e.PayoutID, detail: e.Detail, at: e.At})
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		cursor = page.Next
	}
}

// eventMark is what identifies a safety event across passes.
type eventMark struct {
	id int64
	at time.Time
}

// firstEventAfter is the first event of a guard's log (the proxy's, or
// the payment resource's) after an id, if any.
func (r *Reconciler) firstEventAfter(ctx context.Context, proxy bool, after int64) (eventMark, bool, error) {
	if proxy {
		page, err := r.c.Proxy.SafetyEvents(ctx, strconv.FormatInt(after, 10), 1)
		if err != nil || len(page.Items) == 0 {
			return eventMark{}, false, err
		}
		return eventMark{page.Items[0].ID, page.Items[0].At}, true, nil
	}
	page, err := r.c.Payment.SafetyEvents(ctx, after, 1)
	if err != nil || len(page.Items) == 0 {
		return eventMark{}, false, err
	}
	return eventMark{page.Items[0].ID, page.Items[0].At}, true, nil
}

// cursorRewound reports whether a guard's log no longer holds the event its
// cursor names (id, recorded at at), and notes it; first returns the first
// event after an id. Otherwise it returns the time the event was recorded
// (zero without a cursor). A cursor saved without the event's time (an
// older state file) is checked for the id alone, and gets the time for the
// next pass.
func cursorRewound(rep *Report, guard string, id int64, at time.Time, first func(after int64) (eventMark, bool, error)) (bool, time.Time, error) {
	if id <= 0 {
		return false, at, nil
	}
	got, ok, err := first(id - 1)
	if err != nil {
		return false, at, cannotRun("read the "+guard+"'s safety events", err)
	}
	switch {
	case !ok || got.id != id:
		rep.note("the %s's safety-event log no longer holds event %d, the last one an earlier pass read: its database was restored or failed over behind it; its events are read again from the start", guard, id)
	case !at.IsZero() && !got.at.Equal(at):
		rep.note("the %s's safety event %d was recorded at %s, not at %s as when an earlier pass read it: its database was restored or failed over behind it and gives old ids to new events; its events are read again from the start",
			guard, id, got.at.UTC().Format(time.RFC3339Nano), at.UTC().Format(time.RFC3339Nano))
	default:
		return false, got.at, nil
	}
	return true, time.Time{}, nil
}
