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
	after := r.opts.SafetyEventsAfter.Payment
	rep.SafetyEventsSeen = r.opts.SafetyEventsAfter
	for {
		page, err := r.c.Payment.SafetyEvents(ctx, after, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the payment resource's safety events", err)
		}
		for _, e := range page.Items {
			after = max(after, e.ID)
			rep.SafetyEventsSeen.Payment = max(rep.SafetyEventsSeen.Payment, e.ID)
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
	if n := r.opts.SafetyEventsAfter.Proxy; n > 0 {
		cursor = strconv.FormatInt(n, 10)
	}
	for {
		page, err := r.c.Proxy.SafetyEvents(ctx, cursor, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the rail proxy's safety events", err)
		}
		for _, e := range page.Items {
			rep.SafetyEventsSeen.Proxy = max(rep.SafetyEventsSeen.Proxy, e.ID)
			r.reportSafetyEvent(rep, safetyEvent{guard: "proxy", id: e.ID, kind: e.Kind, key: e.Key, presented: e.PresentedToken, stored: e.StoredToken,
				holder: e.Holder, storedHolder: e.StoredHolder, payoutID: e.PayoutID, detail: e.Detail, at: e.At})
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		cursor = page.Next
	}
}
