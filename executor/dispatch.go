package executor

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/payment/paymentclient"
)

// maxWorkLimit is the payment resource's largest page of GET /v1/work.
const maxWorkLimit = 1000

// Cooldown of an account after a round that moved nothing: a random wait
// in [cur/2, cur], cur 1 s at first and doubling up to 30 s (equal jitter:
// 0.5–1 s, then 1–2 s, ... 15–30 s); reset by the first round that moves a
// payout.
const (
	cooldownMin = time.Second
	cooldownMax = 30 * time.Second
)

// runSession dispatches accounts with work to workers until a stop is
// requested (false) or the session is lost (true). It returns once every
// worker has finished.
func (e *Executor) runSession(sess session, log *slog.Logger) (lost bool) {
	var wg sync.WaitGroup
	defer func() {
		wg.Wait()
		// Whatever this session still holds ends with it.
		e.dropKept(log, lost)
		e.mu.Lock()
		e.wake = nil
		e.mu.Unlock()
	}()
	slots := make(chan struct{}, e.cfg.Concurrency)
	progress := make(chan struct{}, 1)
	e.mu.Lock()
	e.wake = progress // a release a dispatch waited for wakes the loop
	e.mu.Unlock()
	jeopardy := false
	// due: ask for work on this pass (the first one, a round made
	// progress, or the poll interval has passed since the last ask). A pass
	// woken only because a kept grant's linger ended just releases it.
	due := true
	var nextPoll time.Time
	for {
		if e.stopRequested() {
			return false
		}
		if sess.Lost() {
			return true
		}
		now := time.Now()
		due = due || !now.Before(nextPoll)
		var wake time.Time
		if !sess.Healthy() {
			// JEOPARDY: a keepalive failed; start nothing new, and never use
			// a grant kept from before (released once healthy again).
			e.expireKept(now, true)
			nextPoll = now.Add(e.cfg.PollInterval)
			if !jeopardy {
				log.Warn("lock session in jeopardy (a keepalive failed): starting no new work")
				jeopardy = true
				e.m.lockDown.Set(1)
			}
		} else {
			if jeopardy {
				log.Info("lock session healthy again")
				jeopardy = false
				e.m.lockDown.Set(0)
			}
			if due {
				asked := time.Now()
				// While claims are paused (railgate.go) the work is still
				// asked for: payouts in flight are finished as always. Only
				// accounts known to hold nothing but PENDING payouts are
				// left until the pause ends.
				until := e.rail.PausedUntil()
				paused := e.paused(asked)
				idle, retry := e.dispatch(sess, log, slots, progress, &wg, e.workWait(), paused)
				due, nextPoll = false, asked.Add(max(e.cfg.PollInterval, retry))
				if idle {
					// The ask waited for work and none came: ask again
					// at once, so one is always waiting.
					nextPoll = time.Now()
				}
				if paused && until.Before(nextPoll) {
					// The next probe may go then: ask for work at once.
					nextPoll = until
				}
			}
			// After dispatching, so an account listed again is worked on
			// under its kept grant rather than released and re-acquired.
			wake = e.expireKept(time.Now(), false)
			e.startReleases(log, &wg)
		}
		if wake.IsZero() || nextPoll.Before(wake) {
			wake = nextPoll
		}
		t := time.NewTimer(max(time.Until(wake), time.Millisecond))
		select {
		case <-e.stopped.Done():
		case <-progress:
			due = true
		case <-t.C:
		}
		t.Stop()
	}
}

// workLimit is how many accounts to ask for: the accounts this executor is
// already on and those cooling down come back in the list too, so ask for
// those plus twice the free workers — enough that accounts which cannot
// progress never hide the others behind them, without encoding the whole
// backlog of accounts on every poll.
// Entries long past their cooldown are dropped (the account has likely
// left the work list); the next round without progress starts over at 1 s.
func (e *Executor) workLimit(now time.Time, free int) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	cooling := 0
	paused := e.paused(now)
	for acc, c := range e.cooling {
		switch {
		case c.cooling(now, paused):
			cooling++
		case now.Sub(c.until) > 2*cooldownMax:
			delete(e.cooling, acc)
		}
	}
	return min(len(e.active)+cooling+2*free, maxWorkLimit)
}

// workWait is how long an ask for work may wait for some when there is
// none (GET /v1/work's wait_ms): the poll interval, within the payment
// resource's bound and well inside the call's timeout. While it waits, the
// kept grants whose linger ends are not released: they are released when
// the answer comes, so the wait is also at most the linger (a grant is kept
// at most twice its linger). Below minWorkWait it does not wait.
func (e *Executor) workWait() time.Duration {
	w := min(e.cfg.PollInterval, paymentclient.MaxWorkWait, e.cfg.CallTimeout/2)
	if e.cfg.GrantLinger > 0 {
		w = min(w, e.cfg.GrantLinger)
	}
	if w < minWorkWait {
		return 0
	}
	return w
}

// minWorkWait is the shortest wait for work worth asking for.
const minWorkWait = 10 * time.Millisecond

// dispatch asks for accounts with work — waiting up to wait when there is
// none — and starts a worker on each it can. It reports idle when the
// answer was no work after the whole wait (a payment resource that does
// not wait answers at once, and is asked again after the poll interval),
// or when it is to be asked again at once: it refused GET /work's payouts.
// While claims are paused, an account whose listed payouts are all PENDING
// is not started (its round could claim none) and is left out of the asks
// until the pause ends (pauseSkip, at most MaxWorkSkip of them), so that
// the accounts with payouts in flight behind a backlog of PENDING ones
// come up: the ask is made again at once while it lists new such accounts
// and fills its page. retry is set when the payment resource gave no
// answer: the wait before the next ask (workDown's backoff).
func (e *Executor) dispatch(sess session, log *slog.Logger, slots chan struct{}, progress chan struct{}, wg *sync.WaitGroup, wait time.Duration, paused bool) (idle bool, retry time.Duration) {
	free := cap(slots) - len(slots)
	if free == 0 {
		return false, 0 // every worker is busy; a finishing one signals progress
	}
	q := paymentclient.WorkQuery{Limit: e.workLimit(time.Now(), free), Wait: wait, Payouts: e.workPayouts}
	if !paused {
		e.pauseSkip = nil
	}
	for acc := range e.pauseSkip {
		q.Skip = append(q.Skip, acc)
	}
	asked := time.Now()
	ctx, cancel := e.callCtx()
	// A stop request ends a wait for work at once.
	unhook := context.AfterFunc(e.stopped, cancel)
	items, err := e.pay.WorkFor(ctx, q)
	unhook()
	cancel()
	if err != nil && e.stopRequested() {
		return false, 0
	}
	if err == nil || !problem.NoVerdict(err) {
		e.workDown.answered(log, "the payment resource answers again: asking it for work as usual")
	}
	if err == nil && len(items) == 0 {
		return wait > 0 && time.Since(asked) >= wait, 0
	}
	if err != nil {
		if refusedToken(err) {
			e.refuse("payment resource", e.cfg.PaymentURL, err)
			return false, 0
		}
		if e.workPayouts > 0 && refusedParam(err, "payouts") {
			// A payment resource older than the parameter: work as before
			// it, every round listing its account's payouts, and ask again
			// at once.
			e.workPayouts = 0
			log.Warn("the payment resource does not take GET /v1/work's payouts parameter (it is older than this executor); asking without it from now on, every round listing its account's payouts: upgrade the payment resources, then restart the executors", obs.KeyError, err.Error())
			return true, 0
		}
		if !problem.NoVerdict(err) {
			// An answer, not an outage: a defect to be seen on each poll.
			log.Warn("could not ask the payment resource for work", obs.KeyError, err.Error())
			return false, 0
		}
		// No answer: one WARN per outage, not one per poll, and the asks
		// back off while it lasts.
		retry = e.workDown.failed(log, "could not ask the payment resource for work", err)
		return false, retry
	}
	// Executors read the same list; starting at a random place spreads them
	// over the accounts instead of all contending for the first one.
	skipped := 0
	defer func() {
		if skipped > 0 && len(items) >= q.Limit {
			idle = true // a full page, some left out: ask again at once
		}
	}()
	n := len(items)
	start := 0
	if n > 1 {
		start = rand.IntN(n)
	}
	for i := range n {
		it := items[(start+i)%n]
		if e.stopRequested() || !sess.Healthy() {
			return false, 0
		}
		if paused && onlyPending(it) {
			if !e.pauseSkip[it.AccountID] && len(e.pauseSkip) < paymentclient.MaxWorkSkip {
				if e.pauseSkip == nil {
					e.pauseSkip = map[string]bool{}
				}
				e.pauseSkip[it.AccountID] = true
				skipped++
			}
			continue
		}
		select {
		case slots <- struct{}{}:
		default:
			return false, 0 // every worker is busy; the next poll continues
		}
		if !e.reserve(it.AccountID, time.Now()) {
			<-slots
			continue
		}
		wg.Add(1)
		go func(account string, seen workSeen) {
			defer wg.Done()
			res := e.workAccount(sess, log, account, seen)
			moved := e.finishRound(log, account, res, time.Now())
			<-slots
			if moved {
				select {
				case progress <- struct{}{}:
				default:
				}
			}
		}(it.AccountID, workSeen{item: it, asked: asked})
	}
	return false, 0
}

// onlyPending reports whether GET /work listed every actionable payout of
// the account (it lists them when there are few) and all are PENDING.
func onlyPending(it paymentclient.WorkItem) bool {
	if it.Actionable == nil || len(it.Actionable) != it.Payouts {
		return false
	}
	for _, p := range it.Actionable {
		if p.State != paymentclient.Pending {
			return false
		}
	}
	return true
}

// refusedParam reports a 400 invalid_request naming query parameter name.
func refusedParam(err error, name string) bool {
	var field string
	return problem.Has(err, problem.InvalidRequest) && problem.From(err).Extension("field", &field) && field == name
}

// heldSkip is how long an account whose lock another session holds is
// left alone: a second, or the poll interval when that is longer. Waiting
// out the holder's whole linger was measured worse: with two executors at
// 350 payouts/s over 1,000 accounts, a 5 s skip gave p99 2.3–3.2 s, 1 s
// gave 1.4 s (docs/benchmarks-history.md, "Kept grants for work spread thin").
func (e *Executor) heldSkip() time.Duration {
	return max(time.Second, e.cfg.PollInterval)
}

// reserve marks account as worked on by this process, unless a worker (or
// a release retry) already is, or the account is cooling down.
func (e *Executor) reserve(account string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.active[account] {
		if _, ok := e.inRelease[account]; ok {
			e.inRelease[account] = true // its release wakes the poll loop
		}
		return false
	}
	if c := e.cooling[account]; c != nil && c.cooling(now, e.paused(now)) {
		return false
	}
	e.active[account] = true
	return true
}

// unreserve ends what reserve started.
func (e *Executor) unreserve(account string) {
	e.mu.Lock()
	delete(e.active, account)
	e.mu.Unlock()
}

// roundResult is what one grant's work on an account came to.
type roundResult struct {
	// acquired: this executor held the account's lock for the round.
	acquired bool
	// held: the lock service answered that another session holds the
	// account's lock.
	held bool
	// moved: at least one payout changed state under the grant.
	moved bool
	// fenced: a guard refused the grant's token.
	fenced bool
	// empty: the grant's list found nothing to do. GET /v1/work listed
	// the account as its last payout was settling; nothing is wrong there.
	empty bool
	// gated: PENDING payouts were left unclaimed while the rail gives no
	// usable answer; the pause (railgate.go) is the wait, not a cooldown.
	gated bool
}

// paused reports whether claims are paused at now (railgate.go).
func (e *Executor) paused(now time.Time) bool { return now.Before(e.rail.PausedUntil()) }

// coolingLocked is account's cooldown, made on first use; e.mu is held.
func (e *Executor) coolingLocked(account string) *cooldown {
	c := e.cooling[account]
	if c == nil {
		c = &cooldown{b: backoff{min: cooldownMin, max: cooldownMax}}
		e.cooling[account] = c
	}
	return c
}

// finishRound ends a round on account and reports whether it moved a
// payout. A round that took the lock and moved nothing — fenced out, a
// payout the proxy refuses, a payout that cannot be settled yet — cools
// the account down: dispatching it again at once would only mint a token
// (and perhaps a fenced_out event or an ERROR line) per poll. A round that
// found nothing to do does not: GET /v1/work will not list the account
// again until it has work.
func (e *Executor) finishRound(log *slog.Logger, account string, res roundResult, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.active, account)
	switch {
	case res.moved:
		delete(e.cooling, account)
	case res.held:
		// Another executor (or an operator, or the reconciler) has it, and
		// an executor keeps an account's grant for up to its linger while
		// more payouts come. Asking again on every poll would cost the lock
		// service a request per such account per poll and change nothing:
		// the holder pays them. The account is left alone for heldSkip,
		// without the backoff a round that made no progress earns.
		c := e.coolingLocked(account)
		c.until, c.pause = now.Add(e.heldSkip()), false
	case res.gated:
		// PENDING payouts left while claims are paused: nothing to do
		// on the account until the next probe may go, or the pause ends,
		// without the backoff or the warning of a round that made no
		// progress.
		c := e.coolingLocked(account)
		c.until, c.pause = e.rail.PausedUntil(), true
	case res.acquired && !res.empty:
		c := e.coolingLocked(account)
		wait := c.b.next()
		c.until, c.pause = now.Add(wait), false
		msg := "no progress on the account: leaving it alone for a while"
		if res.fenced {
			msg = "account fenced out: leaving it alone for a while"
		}
		e.m.cooldowns.Inc()
		log.Warn(msg, obs.KeyAccountID, account, "retry_in", wait.String())
	}
	return res.moved
}
