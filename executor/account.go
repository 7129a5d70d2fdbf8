package executor

import (
	"errors"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// Why a worker stops working on an account. None of them is an error of
// the executor: each ends the grant's work and releases the lock.
var (
	errStop       = errors.New("stop requested")
	errGrantLost  = errors.New("grant no longer valid")
	errFenced     = errors.New("fenced out: a later holder owns the account")
	errLeave      = errors.New("account left for a later pass")
	errTransient  = errors.New("transient failure")
	errStepBudget = errors.New("too many steps for one payout")
)

// maxStepsPerPayout bounds the steps (including retries) spent on one
// payout under one grant; reaching it is a defect worth a log line.
const maxStepsPerPayout = 200

// inFlight are the states a worker finishes before claiming anything new,
// in the order they are taken.
var inFlight = []pc.State{pc.RailAcked, pc.RailSubmitted, pc.Claimed}

// actionable are the states a grant lists: in flight, then PENDING.
var actionable = append(slices.Clone(inFlight), pc.Pending)

// pendingPage is how many actionable payouts one list call brings.
const pendingPage = maxPayoutsPerGrant

// workPayouts is GET /work's payouts: an account with at most this many
// actionable payouts comes with them, and a round under the account's
// kept grant starts from them instead of a list (workSeen). Work spread
// thin over many accounts has one or two a round; an account with a
// backlog is listed a page at a time, as before.
const workPayouts = 4

// workSeen is what GET /work answered about an account, and when it was
// asked.
type workSeen struct {
	item  pc.WorkItem
	asked time.Time
}

// startingPayouts is the account's actionable payouts as GET /work saw
// them, when a round under k — a grant kept from the account's previous
// round — can start from them instead of listing them: they are all of
// them (w.item.Actionable is nil when the account had more), read in the
// same snapshot as the account's fence, which was k's token — so no other
// holder had written the account — and asked after k's last round ended,
// so that snapshot had every write made under k. Payouts created since
// are found by a later round, as after a list. ok is false when a list is
// needed.
func startingPayouts(w workSeen, k keptGrant) (ps []pc.Payout, ok bool) {
	if k.g == nil || w.item.Actionable == nil || w.item.FenceToken != k.g.Token() || !k.since.Before(w.asked) {
		return nil, false
	}
	return w.item.Actionable, true
}

// run is one grant's work on one account.
type run struct {
	e       *Executor
	g       grant
	account string
	log     *slog.Logger
	// stale is set by the hold test hook: the grant check is skipped so the
	// writes of a process paused past its lease reach the guards.
	stale bool
	// moved is set once a payout changed state under this grant.
	moved bool

	// queue holds the in-flight payouts listed but not yet driven under
	// this grant, pending the PENDING ones. The list is a hint, not a
	// decision: each step's guard and transition table decide, and a payout
	// that moved meanwhile is re-read.
	queue   []pc.Payout
	pending []pc.Payout
	// listedAll is set when the last list came back short: the account had
	// no more actionable payouts, and one created since waits for /work.
	listedAll bool
	// listed counts the payouts the grant's lists brought.
	listed int
	// gated is set when PENDING payouts were left unclaimed because the
	// rail gives no usable answer (railgate.go).
	gated bool
	// left are the in-flight payouts this grant left (errLeave,
	// errStepBudget): not listed again under it, so that one payout the
	// guards or the rail keep refusing does not hold up the account's
	// others.
	left map[string]bool
	// payDown and proxyDown are the guards' outages as this run sees them:
	// a guard that gives no usable answer is retried with backoff, and
	// each retry was a WARN line (4 workers on a proxy that hangs: 77 in
	// 30 s). An outage is one WARN, a reminder a minute, one INFO at the
	// first answer (outage.go).
	payDown, proxyDown outage
}

// guardDown is the run's outage of guard ("payment" or "proxy").
func (r *run) guardDown(guard string) *outage {
	if guard == "proxy" {
		return &r.proxyDown
	}
	return &r.payDown
}

// heard records that guard answered step's call: it ends the run's outage
// of guard, if one was going on.
func (r *run) heard(guard, step string) {
	r.guardDown(guard).answered(r.log, "the "+guardService[guard]+" answers again", "step", step, "guard", guard)
}

// workAccount drives the account's payouts under its lock: the grant kept
// from its previous round if there is one still valid, else one taken
// without waiting. It reports whether it held the lock, whether any payout
// changed state, whether a guard fenced the grant out, and whether there
// was nothing to do. A round that moved payouts and left the account with
// nothing more to do keeps its grant for the next one (linger.go); so does
// a round under a kept grant that found nothing to do (its linger runs
// on); any other round releases it.
func (e *Executor) workAccount(sess session, log *slog.Logger, account string, seen workSeen) (res roundResult) {
	key := fencing.Key(account)
	k, ended := e.takeKept(account, time.Now())
	if ended != nil && !e.release(log.With(obs.KeyKey, key, obs.KeyAccountID, account), account, ended) {
		// Kept past its end, and its release got no verdict: an acquire
		// now would hand this session the same token, and the release,
		// landing late, would free it under this round. The release is
		// retried with the next poll (releaseLater); leave the account
		// until then, as when another session holds it.
		res.held = true
		return res
	}
	// An ended grant given back (takeKept), the key is taken as for any
	// account: leaving the account instead left its payout waiting a second.
	g, since, acquired := k.g, k.since, k.acquired
	how := "kept lock reused"
	if g == nil {
		how = "lock acquired"
		if g, res.held = e.acquire(sess, log, account, key); g == nil {
			return res
		}
		acquired = time.Now()
	} else {
		e.m.acquires.WithLabelValues("kept").Inc()
	}
	res.acquired = true
	e.m.activeGrants.Inc()
	r := &run{e: e, g: g, account: account, log: e.log.With(obs.KeyKey, key, obs.KeyAccountID, account,
		obs.KeyToken, int64(g.Token()), obs.KeyHolder, string(g.Holder()))}
	r.log.Debug(how)
	if ps, ok := startingPayouts(seen, k); ok {
		r.take(ps, true)
	}
	idle := false // the round ended with nothing more to do
	defer func() {
		res.moved, res.empty, res.gated = r.moved, idle && r.listed == 0, r.gated
		e.m.activeGrants.Dec()
		switch {
		case idle && r.moved:
			since = time.Now()
		case res.empty:
			// since: the kept grant's linger, if any, runs on.
		default:
			since = time.Time{}
		}
		if !since.IsZero() && e.keep(account, keptGrant{g: g, since: since, acquired: acquired}) {
			r.log.Debug("lock kept for the account's next round", "linger", e.cfg.GrantLinger.String())
			return
		}
		e.release(r.log, account, g)
	}()
	for n := 0; n < maxPayoutsPerGrant; {
		ps, pending, err := r.next(maxPayoutsPerGrant - n)
		if err != nil {
			r.log.Warn("could not list the account's payouts; leaving it for a later pass", obs.KeyError, err.Error())
			return res
		}
		if len(ps) == 0 {
			idle = true
			return res
		}
		n += len(ps)
		if pending {
			var waiting int
			waiting, err = r.driveBatch(ps)
			n -= waiting // back in r.pending, not driven
		} else {
			err = r.drive(ps[0], false)
			if errors.Is(err, errLeave) || errors.Is(err, errStepBudget) {
				// This payout waits for a later round; the account's
				// other payouts go on under this grant.
				r.log.Info("leaving the payout for a later round; the account's other payouts go on", obs.KeyPayoutID, ps[0].ID, "reason", err.Error())
				if r.left == nil {
					r.left = map[string]bool{}
				}
				r.left[ps[0].ID] = true
				continue
			}
		}
		if errors.Is(err, errFenced) {
			r.log.Warn("stopping work on the account", obs.KeyPayoutID, ps[0].ID, "reason", err.Error())
			res.fenced = true
			return res
		}
		if err != nil {
			lvl := slog.LevelInfo
			if errors.Is(err, errStepBudget) {
				lvl = slog.LevelWarn
			}
			r.log.Log(e.base, lvl, "stopping work on the account", obs.KeyPayoutID, ps[0].ID, "reason", err.Error())
			return res
		}
	}
	return res
}

// acquire takes the account's lock without waiting; nil when it is not
// had: held by another session (held true; normal) or the lock service
// failing.
func (e *Executor) acquire(sess session, log *slog.Logger, account, key string) (g grant, held bool) {
	e.mu.Lock()
	queued, ok := e.unreleased[account]
	e.mu.Unlock()
	if ok && queued.failed {
		// A release of this session's grant got no verdict and may still
		// land: an acquire now would hand the session the same token, and
		// the release, landing late, would free it under this round. Leave
		// the account until the release pass has settled it, as when
		// another session holds it.
		log.Debug("account's last release got no verdict; leaving it until that release is settled", obs.KeyKey, key, obs.KeyAccountID, account)
		return nil, true
	}
	ctx, cancel := e.callCtx()
	g, err := sess.TryAcquire(ctx, key)
	cancel()
	if err != nil {
		switch {
		case problem.Has(err, problem.LockHeld):
			// Another executor is on it: normal.
			e.m.acquires.WithLabelValues("held").Inc()
			log.Debug("account locked by another holder; skipping", obs.KeyKey, key, obs.KeyAccountID, account)
			return nil, true
		case refusedToken(err):
			e.m.acquires.WithLabelValues("error").Inc()
			e.refuse("lock service", e.cfg.LockURL, err)
		default:
			e.m.acquires.WithLabelValues("error").Inc()
			log.Warn("could not take the account's lock; skipping it (fail closed)", obs.KeyKey, key, obs.KeyAccountID, account, obs.KeyError, err.Error())
		}
		return nil, false
	}
	e.m.acquires.WithLabelValues("acquired").Inc()
	// A re-acquire by this session returns the same grant, released or
	// kept like any other: an earlier queued release of it, never sent
	// (above), is superseded.
	e.mu.Lock()
	delete(e.unreleased, account)
	e.mu.Unlock()
	return g, false
}

// next finds what to work on: an in-flight payout first, alone (the
// recovery table, one payout at a time), then PENDING ones, oldest first,
// as many as room allows and the funds cover, to drive together (pending
// true). RAIL_AMBIGUOUS payouts wait for evidence and do not block the
// account (their money is held back from the funds check, D-7). One list
// call brings a page of the account's actionable payouts, in-flight and
// PENDING alike, instead of four calls per payout.
func (r *run) next(room int) (ps []pc.Payout, pending bool, err error) {
	if len(r.queue) == 0 && len(r.pending) == 0 && !r.listedAll {
		items, err := r.list(pendingPage, actionable...)
		if err != nil {
			return nil, false, err
		}
		// A full page may have left some out: look again when it is done.
		r.take(items, len(items) < pendingPage)
	}
	if len(r.queue) > 0 {
		p := r.queue[0]
		r.queue = r.queue[1:]
		return []pc.Payout{p}, false, nil
	}
	if len(r.pending) == 0 || room <= 0 {
		return nil, false, nil
	}
	// While the rail gives no usable answer, claims wait (railgate.go).
	room = r.e.rail.Admit(time.Now(), min(room, len(r.pending)))
	if room == 0 {
		r.gated = true
		return nil, false, nil
	}
	// The claim takes only what the funds cover (batch.go): the rest comes
	// back to r.pending, for the next batch.
	ps, r.pending = r.pending[:room], r.pending[room:]
	return ps, true, nil
}

// take queues items, a page of the account's actionable payouts in id
// order (all of them when all is set), for next: in-flight ones first, in
// inFlight's order, then the PENDING ones.
func (r *run) take(items []pc.Payout, all bool) {
	r.listedAll = all
	r.listed += len(items)
	for _, p := range items {
		if r.left[p.ID] {
			continue
		}
		if p.State == pc.Pending {
			r.pending = append(r.pending, p)
		} else {
			r.queue = append(r.queue, p)
		}
	}
	slices.SortStableFunc(r.queue, func(a, b pc.Payout) int {
		return slices.Index(inFlight, a.State) - slices.Index(inFlight, b.State)
	})
}

// list returns a page of the account's payouts in the given states, by id.
func (r *run) list(limit int, states ...pc.State) ([]pc.Payout, error) {
	ctx, cancel := r.e.callCtx()
	defer cancel()
	page, err := r.e.pay.Payouts(ctx, pc.PayoutFilter{States: states, AccountID: r.account, Limit: limit})
	return page.Items, err
}

// check is the client-side check before every step (liveness, not safety).
func (r *run) check() error {
	if r.e.stopRequested() {
		return errStop
	}
	if !r.stale && !r.g.Valid() {
		return errGrantLost
	}
	return nil
}

// drive moves one payout as far as this grant can take it: to POSTED,
// FAILED or RAIL_AMBIGUOUS, or until the grant or the guards say stop.
// unsure says p may be behind the payment resource (a step whose answer
// was lost may have landed): p is then read back before anything is done
// with it.
func (r *run) drive(p pc.Payout, unsure bool) error {
	bo := backoff{min: 100 * time.Millisecond, max: 3 * time.Second}
	// marked is true right after this grant recorded RAIL_SUBMITTED itself:
	// nobody can have forwarded the payout, so it is submitted at once. A
	// RAIL_SUBMITTED payout found any other way asks the proxy first (D-4).
	marked := false
	for steps := 0; ; steps++ {
		if unsure {
			// Never a step from a state that may be stale: a step that
			// already landed, sent again, is refused as an invalid
			// transition and recorded as a rejected_transition, evidence
			// of a replay that never was. Until the payout can be read,
			// nothing is done with it.
			fresh, err := r.reread(p)
			if err != nil {
				if !errors.Is(err, errTransient) {
					return err
				}
				if err := r.check(); err != nil {
					return err
				}
				if steps >= maxStepsPerPayout {
					r.log.Error("payout could not be read back within the step budget; leaving it", obs.KeyPayoutID, p.ID, "state", string(p.State))
					return errStepBudget
				}
				if !r.e.sleep(bo.next()) {
					return errStop
				}
				continue
			}
			p, unsure = fresh, false
		}
		if p.State.Terminal() || p.State == pc.RailAmbiguous {
			return nil
		}
		if err := r.check(); err != nil {
			return err
		}
		if steps >= maxStepsPerPayout {
			r.log.Error("payout did not settle within the step budget; leaving it", obs.KeyPayoutID, p.ID, "state", string(p.State))
			return errStepBudget
		}
		var (
			next pc.Payout
			err  error
		)
		if p.State == pc.RailSubmitted && marked {
			next, err = r.submit(p)
		} else {
			next, err = r.step(p)
		}
		marked = err == nil && p.State == pc.Claimed && next.State == pc.RailSubmitted
		if err == nil {
			p = next
			bo.reset()
			continue
		}
		if !errors.Is(err, errTransient) {
			return err
		}
		// Safe to retry (claim, submitting, outcome, post are guarded and
		// have no outside effect; a lost submit is never re-sent here): wait,
		// then re-read the payout and act on the state it is really in.
		if !r.e.sleep(bo.next()) {
			return errStop
		}
		unsure = true
	}
}

// step does the one action the payout's state calls for (the recovery
// table of docs/executor.md).
func (r *run) step(p pc.Payout) (pc.Payout, error) {
	tok, holder := r.g.Token(), r.g.Holder()
	switch p.State {
	case pc.Pending:
		return r.mutate("claim", p, AfterClaimed, func() (pc.Payout, error) {
			ctx, cancel := r.e.callCtx()
			defer cancel()
			return r.e.pay.Claim(ctx, p.ID, tok, holder)
		})
	case pc.Claimed:
		if p.ClaimedBy != holder || p.Token != tok {
			// A previous holder's claim: take it over under our token.
			return r.mutate("reclaim", p, AfterClaimed, func() (pc.Payout, error) {
				ctx, cancel := r.e.callCtx()
				defer cancel()
				return r.e.pay.Claim(ctx, p.ID, tok, holder)
			})
		}
		// D-4: RAIL_SUBMITTED is recorded before the proxy is called.
		return r.mutate("submitting", p, AfterSubmitting, func() (pc.Payout, error) {
			ctx, cancel := r.e.callCtx()
			defer cancel()
			return r.e.pay.Submitting(ctx, p.ID, tok, holder)
		})
	case pc.RailSubmitted:
		return r.submitted(p)
	case pc.RailAcked:
		// Money has left; completing the ledger is safe to retry forever.
		return r.mutate("post", p, AfterPosted, func() (pc.Payout, error) {
			ctx, cancel := r.e.callCtx()
			defer cancel()
			return r.e.pay.Post(ctx, p.ID, tok, holder)
		})
	}
	return p, nil
}

// mutate runs one guarded payment-resource call and classifies its answer.
func (r *run) mutate(step string, p pc.Payout, after Point, call func() (pc.Payout, error)) (pc.Payout, error) {
	start := time.Now()
	next, err := call()
	r.e.m.stepLatency.WithLabelValues(step).Observe(time.Since(start).Seconds())
	if err == nil {
		r.heard("payment", step)
		r.e.m.steps.WithLabelValues(step, resultOK).Inc()
		if next.State != p.State {
			r.moved = true
		}
		r.transition(step, p, next)
		if (p.State != next.State || step == "reclaim") && (after != AfterClaimed || next.State == pc.Claimed) {
			r.hook(after, next)
		}
		return next, nil
	}
	return p, r.failed(step, "payment", p, err)
}

// guardService names each guard as the operator knows it.
var guardService = map[string]string{"payment": "payment resource", "proxy": "rail proxy"}

// failed classifies a failed call to a guard.
func (r *run) failed(step, guard string, p pc.Payout, err error) error {
	log := r.log.With("step", step, obs.KeyPayoutID, p.ID, "state", string(p.State))
	var pe *problem.Error
	if !problem.NoVerdict(err) {
		r.heard(guard, step) // a refusal is an answer
	}
	switch {
	case problem.Has(err, problem.FencedOut):
		errors.As(err, &pe)
		r.e.m.steps.WithLabelValues(step, resultFencedOut).Inc()
		r.e.m.fencedOut.WithLabelValues(guard).Inc()
		log.Warn("fenced out: the "+guard+" guard refused our token; a later holder owns the account",
			obs.KeyEvent, "fenced_out", "guard", guard, "presented_token", pe.PresentedToken, "stored_token", pe.StoredToken)
		return errFenced
	case problem.Has(err, problem.InvalidTransition):
		// The payout moved under us (an earlier attempt landed after all).
		r.e.m.steps.WithLabelValues(step, resultRejected).Inc()
		log.Warn("transition rejected: the payout is not in the state we saw; re-reading it", obs.KeyError, err.Error())
		return errTransient
	case refusedToken(err):
		r.e.m.steps.WithLabelValues(step, resultClientFail).Inc()
		url := r.e.cfg.PaymentURL
		if guard == "proxy" {
			url = r.e.cfg.ProxyURL
		}
		r.e.refuse(guardService[guard], url, err)
		return errStop
	case errors.As(err, &pe) && pe.Code != problem.Unavailable && pe.Code != problem.Internal && pe.Status() < 500:
		// invalid_request, not_found, forbidden, unauthorized...: retrying
		// cannot help; leave the account and say so loudly.
		r.e.m.steps.WithLabelValues(step, resultClientFail).Inc()
		log.Error("request refused; leaving the account", obs.KeyError, err.Error(), "code", string(pe.Code))
		return errLeave
	default:
		r.e.m.steps.WithLabelValues(step, resultTransient).Inc()
		// One WARN per outage of the guard in this run, not per retry.
		r.guardDown(guard).failed(log, "no usable answer; will re-read and retry", err, "transport", errors.Is(err, httpx.ErrTransport))
		return errTransient
	}
}

// transition logs one state change and counts final outcomes. Where a
// payout ends is logged at info; the steps on the way (recorded in paydb's
// payout_event anyway) at debug, so the log costs one line per payout.
// RAIL_AMBIGUOUS is at info too: under rail faults it is an expected
// outcome, the fault itself has its WARN lines (the rail pause, a guard
// without an answer), and the reconciler reports one left too long. Its
// reason — rail_timeout, no_recorded_outcome, submission_mismatch, the
// proxy's error code — is the payout's error_code (failure_reason is only
// a FAILED payout's), so that is logged when set.
func (r *run) transition(step string, from, to pc.Payout) {
	lvl := slog.LevelDebug
	if from.State != to.State {
		switch to.State {
		case pc.Posted, pc.Failed, pc.RailAmbiguous:
			r.e.m.outcomes.WithLabelValues(string(to.State)).Inc()
			lvl = slog.LevelInfo
		}
	}
	args := []any{obs.KeyPayoutID, to.ID, "step", step, "from", string(from.State), "to", string(to.State), "failure_reason", to.FailureReason}
	if to.ErrorCode != "" {
		args = append(args, "error_code", to.ErrorCode)
	}
	r.log.Log(r.e.base, lvl, "payout transition", args...)
}

// hook runs the test hook armed for point, if any.
func (r *run) hook(point Point, p pc.Payout) {
	h := r.e.cfg.Hooks
	if h.CrashAfter == point {
		r.e.m.hooks.WithLabelValues("crash", string(point)).Inc()
		r.log.Error("test hook: crashing", "point", string(point), obs.KeyPayoutID, p.ID, "state", string(p.State))
		os.Exit(CrashExitCode)
	}
	if h.HoldAfter == point && !r.stale {
		r.e.m.hooks.WithLabelValues("hold", string(point)).Inc()
		r.log.Warn("test hook: holding", "point", string(point), obs.KeyPayoutID, p.ID, "state", string(p.State))
		select {
		case <-r.g.Done():
			r.stale = true
			r.log.Warn("test hook: grant lost while holding; resuming WITHOUT the grant check", "point", string(point), obs.KeyPayoutID, p.ID)
		case <-r.e.stopped.Done():
		}
	}
}
