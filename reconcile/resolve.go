package reconcile

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// resolveAmbiguous looks every RAIL_AMBIGUOUS payout up at the rail
// (through the proxy, by its client reference) and resolves the ones the
// rail gives a final answer for: settled -> RAIL_ACKED (the executor then
// posts it), absent -> FAILED. Each resolution is made under a grant of
// the payout's account, with its token (D-8). Time alone never resolves
// anything: a payout the rail has no final answer for is left. A payout
// that could not be looked at (a service unreachable or failing) is left
// too, and the others are still tried; the error then returned wraps
// errResolutionIncomplete: the pass goes on with its checks and ends
// "could not run" (exit 2), since money may be held that a working system
// would have released or posted.
func (r *Reconciler) resolveAmbiguous(ctx context.Context, rep *Report) error {
	after := ""
	var (
		failed int
		first  error
	)
	for {
		page, err := r.c.Payment.Payouts(ctx, pc.PayoutFilter{State: pc.RailAmbiguous, After: after, Limit: r.opts.PageSize})
		if err != nil {
			return cannotRun("list the ambiguous payouts", err)
		}
		for _, p := range page.Items {
			if err := ctx.Err(); err != nil {
				return cannotRun("resolve ambiguous payouts", err)
			}
			if err := r.resolveOne(ctx, rep, p); err != nil {
				failed++
				if first == nil {
					first = fmt.Errorf("payout %s: %w", p.ID, err)
				}
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		after = page.Next
	}
	if failed > 0 {
		return cannotRun(fmt.Sprintf("resolve %d ambiguous payout(s)", failed), fmt.Errorf("%w: first, %w", errResolutionIncomplete, first))
	}
	return nil
}

// errResolutionIncomplete: some ambiguous payouts could not be looked at.
var errResolutionIncomplete = errors.New("a service the resolution needs failed")

// lookupEvidence is the evidence recorded with a resolution.
type lookupEvidence struct {
	Source       string                    `json:"source"`
	ClientRef    string                    `json:"client_ref"`
	Final        bool                      `json:"final"`
	Resolution   proxyclient.Resolution    `json:"resolution"`
	SubmissionID int64                     `json:"submission_id"`
	Outcome      proxyclient.Outcome       `json:"submission_outcome"`
	RailItems    []proxyclient.RailPayment `json:"rail_items"`
	// RailItemsLeftOut counts the rail's payments left out of RailItems to
	// keep the evidence within what the payment resource records; the
	// proxy's lookup shows them all.
	RailItemsLeftOut int       `json:"rail_items_left_out,omitempty"`
	AskedAt          time.Time `json:"asked_at"`
}

// text is the evidence as the payment resource records it: at most
// wire.MaxTextLen bytes of valid text. The rail's payments are its own text
// and as many as it holds for the client reference (a duplicate payment
// adds one): their strings are made one line each, and the last ones are
// left out, counted, while the whole is too long. Refused, the resolution
// would be tried and refused again on every pass, the payout's money held.
func (ev lookupEvidence) text() (string, error) {
	items := make([]proxyclient.RailPayment, len(ev.RailItems))
	for i, it := range ev.RailItems {
		for _, f := range []*string{&it.RailRef, &it.ClientRef, &it.Currency, &it.BeneficiaryRef, &it.Status, &it.DeclineCode, &it.At} {
			*f = wire.OneLine(*f, wire.MaxRefLen)
		}
		items[i] = it
	}
	ev.RailItems = items
	for {
		raw, err := json.Marshal(ev)
		if err != nil || len(raw) <= wire.MaxTextLen || len(ev.RailItems) == 0 {
			return string(raw), err
		}
		ev.RailItems = ev.RailItems[:len(ev.RailItems)-1]
		ev.RailItemsLeftOut++
	}
}

func (r *Reconciler) leave(rep *Report, p pc.Payout, format string, args ...any) {
	reason := fmt.Sprintf(format, args...)
	rep.Unresolved = append(rep.Unresolved, Pending{PayoutID: p.ID, AccountID: p.AccountID, Reason: reason})
	r.log.Info("ambiguous payout left unresolved", obs.KeyPayoutID, p.ID, obs.KeyAccountID, p.AccountID, "reason", reason)
}

// conflict leaves payout p for a human because the rail's final evidence
// contradicts the proxy's record or does not fit the payout, and reports
// it at once: no later pass will resolve it, and waiting for the ambiguity
// SLA would hide for a day a payout whose money may have left.
func (r *Reconciler) conflict(rep *Report, p pc.Payout, lk proxyclient.LookupResult, format string, args ...any) {
	r.leave(rep, p, format, args...)
	rep.add(CheckAmbiguousConflict, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "client_ref": p.ClientRef,
		"amount": p.Amount, "currency": p.Currency, "submission_id": lk.Submission.ID, "outcome": string(lk.Submission.Outcome),
		"resolution": string(lk.Resolution), "rail_refs": lookupRefs(lk.RailItems)},
		"payout %s is RAIL_AMBIGUOUS and will not be resolved automatically: "+format, append([]any{p.ID}, args...)...)
}

func lookupRefs(items []proxyclient.RailPayment) []string {
	refs := make([]string, 0, len(items))
	for _, it := range items {
		refs = append(refs, it.RailRef)
	}
	return refs
}

// resolveOne resolves payout p if the rail's answer is final and fits the
// payout, or leaves it, saying why. The error is a service that failed:
// the payout could not be looked at.
func (r *Reconciler) resolveOne(ctx context.Context, rep *Report, p pc.Payout) error {
	log := r.log.With(obs.KeyPayoutID, p.ID, obs.KeyAccountID, p.AccountID)
	// Measured from its entry into RAIL_AMBIGUOUS.
	now := r.opts.Now()
	since, old, err := r.ambiguousLongerThan(ctx, p, now, r.opts.SettlementWindow)
	switch {
	case err != nil:
		r.leave(rep, p, "could not read the payout's history: %v", err)
		return err
	case !old && r.opts.SettlementWindow > 0:
		r.leave(rep, p, "ambiguous for %s, less than the settlement window %s; looked up later", now.Sub(since).Round(time.Second), r.opts.SettlementWindow)
		return nil
	}
	key := lockKey(p.AccountID)
	lease, held, err := r.c.Lock.Acquire(ctx, key, 0)
	if err == nil && held && r.opts.LockWait > 0 {
		// An executor keeps an account's grant between its rounds (up to
		// twice its grant linger from the acquire): wait for it to end.
		log.Info("the account's lock is held by another session; waiting for it", obs.KeyKey, key, "lock_wait", r.opts.LockWait.String())
		lease, held, err = r.c.Lock.Acquire(ctx, key, r.opts.LockWait)
	}
	if err != nil {
		log.Warn("could not acquire the account's lock to resolve an ambiguous payout", obs.KeyKey, key, obs.KeyError, err.Error())
		r.leave(rep, p, "could not acquire %s: %v", key, err)
		return err
	}
	if held {
		waited := ""
		if r.opts.LockWait > 0 {
			waited = " (waited " + r.opts.LockWait.String() + ")"
		}
		r.leave(rep, p, "%s is held by another session%s; resolved on a later pass", key, waited)
		return nil
	}
	log = log.With(obs.KeyKey, key, obs.KeyToken, int64(lease.Token), obs.KeyHolder, string(lease.Holder))
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		if err := r.c.Lock.Release(rctx, key, lease); err != nil {
			log.Warn("could not release the account's lock; retrying on the next pass", obs.KeyError, err.Error())
		}
	}()

	// Under the grant, the payout's state is what it is: read it again.
	cur, err := r.c.Payment.Payout(ctx, p.ID)
	if err != nil {
		r.leave(rep, p, "could not read the payout under the grant: %v", err)
		return err
	}
	if cur.State != pc.RailAmbiguous {
		log.Info("payout no longer ambiguous; nothing to resolve", "state", string(cur.State))
		return nil
	}
	lk, err := r.c.Proxy.Lookup(ctx, p.ID)
	switch {
	case isNotFound(err):
		r.leave(rep, p, "the proxy has no forwarded submission for it; see %s", CheckAmbiguousNoSubmission)
		return nil
	case err != nil:
		r.leave(rep, p, "the rail could not be asked through the proxy: %v", err)
		return err
	case !lk.Final || lk.Resolution == proxyclient.ResolutionNone:
		detail := lk.Detail
		if detail == "" {
			detail = "the rail's answer is not final yet"
		}
		r.leave(rep, p, "%s", detail)
		return nil
	}
	var res pc.Resolution
	switch lk.Resolution {
	case proxyclient.ResolutionSettled:
		res = pc.ResolutionSettled
	case proxyclient.ResolutionAbsent:
		res = pc.ResolutionAbsent
	default:
		r.leave(rep, p, "the proxy answered an unknown resolution %q", lk.Resolution)
		return nil
	}
	// A submission that is not this payout's as it stands, or a payment of
	// another amount, is never resolved either way: the executor and the
	// proxy left it ambiguous for a human (submission_mismatch,
	// rail_answer_mismatch), and posting it would book the payout's amount
	// where the rail moved another.
	if why := mismatch(cur, lk); why != "" {
		log.Error("the rail's evidence does not fit the payout; left for a human", "why", why, "resolution", string(lk.Resolution))
		r.conflict(rep, cur, lk, "%s; the rail's final lookup says %s: resolve it by hand", why, lk.Resolution)
		return nil
	}
	// The proxy may hold the rail's own answer, recorded after the
	// executor reported the payout ambiguous. A lookup that contradicts it
	// (an ACK and no payment, a decline and a settled payment) is not
	// evidence enough to fail or post the payout: a human decides.
	if o := lk.Submission.Outcome; (o == proxyclient.OutcomeAcked && res == pc.ResolutionAbsent) ||
		(o == proxyclient.OutcomeRejected && res == pc.ResolutionSettled) {
		log.Error("the rail's lookup contradicts the answer the proxy recorded from it; left for a human",
			"outcome", string(o), "rail_ref", lk.Submission.RailRef, "resolution", string(lk.Resolution), "rail_payments", len(lk.RailItems))
		r.conflict(rep, cur, lk, "the proxy recorded the rail's answer %s (rail_ref %q), but the rail's final lookup says %s: the rail contradicts itself; resolve it by hand",
			o, lk.Submission.RailRef, lk.Resolution)
		return nil
	}
	ev := lookupEvidence{
		Source: "rail lookup by client reference through the rail proxy", ClientRef: lk.Submission.ClientRef,
		Final: lk.Final, Resolution: lk.Resolution, SubmissionID: lk.Submission.ID, Outcome: lk.Submission.Outcome,
		RailItems: lk.RailItems, AskedAt: r.opts.Now().UTC(),
	}
	if ev.RailItems == nil {
		ev.RailItems = []proxyclient.RailPayment{}
	}
	evidence, err := ev.text()
	if err != nil {
		r.leave(rep, p, "could not encode the evidence: %v", err)
		return nil
	}
	// No new step under a grant in jeopardy (D-11), and none that outlives
	// the grant: its session may have expired, another holder taken the
	// account, and this write would only be fenced out.
	if !lease.usable() {
		log.Warn("the account's grant is no longer healthy (a keepalive of the reconciler's session failed); not resolving under it")
		r.leave(rep, p, "the grant of %s is no longer healthy (a keepalive failed); resolved on a later pass", key)
		return nil
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if lease.Ctx != nil {
		defer context.AfterFunc(lease.Ctx, cancel)()
	}
	out, err := r.c.Payment.Resolve(wctx, p.ID, lease.Token, lease.Holder, res, evidence, settledRef(res, lk.RailItems))
	switch {
	case problem.Has(err, problem.FencedOut):
		log.Warn("resolution fenced out at the payment resource: a newer holder owns the account", obs.KeyEvent, "fenced_out", obs.KeyError, err.Error())
		r.leave(rep, p, "fenced out at the payment resource (a newer holder owns the account)")
		return nil
	case refused(err):
		log.Warn("resolution refused", obs.KeyError, err.Error())
		r.leave(rep, p, "the payment resource refused the resolution: %v", err)
		return nil
	case err != nil:
		log.Warn("resolution could not be written", obs.KeyError, err.Error())
		r.leave(rep, p, "the resolution could not be written: %v", err)
		return err
	}
	log.Info("ambiguous payout resolved from rail evidence", "resolution", string(res), "state", string(out.State), "rail_payments", len(lk.RailItems))
	rep.Resolved = append(rep.Resolved, Resolved{
		PayoutID: p.ID, AccountID: p.AccountID, ClientRef: p.ClientRef, Resolution: string(res),
		State: string(out.State), Token: lease.Token, Evidence: evidence,
	})
	return nil
}

// mismatch says how the proxy's submission or the rail's settled payments
// differ from payout cur, or "" when they fit it.
func mismatch(cur pc.Payout, lk proxyclient.LookupResult) string {
	if sub := lk.Submission; !sub.IsOf(cur.ID, cur.Amount, cur.Currency, cur.ClientRef) {
		return fmt.Sprintf("the proxy's submission %d (payout %s, client_ref %q, %d %s) is not the payout's (client_ref %q, %d %s)",
			sub.ID, sub.PayoutID, sub.ClientRef, sub.Amount, sub.Currency, cur.ClientRef, cur.Amount, cur.Currency)
	}
	for _, it := range lk.RailItems {
		if it.Status == railclient.StatusSettled && (it.Amount != cur.Amount || it.Currency != cur.Currency) {
			return fmt.Sprintf("the rail settled %d %s (rail_ref %q) for a payout of %d %s", it.Amount, it.Currency, it.RailRef, cur.Amount, cur.Currency)
		}
	}
	return ""
}

// settledRef is the rail's reference of the payment a SETTLED resolution
// rests on (the first settled one: a second is a duplicate payment, its
// own finding), as one line the payment resource takes; "" with ABSENT.
func settledRef(res pc.Resolution, items []proxyclient.RailPayment) string {
	if res != pc.ResolutionSettled {
		return ""
	}
	for _, it := range items {
		if it.Status == railclient.StatusSettled && it.RailRef != "" {
			return wire.OneLine(it.RailRef, wire.MaxRefLen)
		}
	}
	return ""
}

// refused reports an answer the payment resource gave about the request
// itself (other than a refused credential): a verdict, not a failure to
// reach it.
func refused(err error) bool {
	return err != nil && !problem.NoVerdict(err) && !problem.Has(err, problem.Unauthorized) && !problem.Has(err, problem.Forbidden)
}
