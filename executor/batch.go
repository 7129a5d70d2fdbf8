package executor

import (
	"cmp"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// maxSubmitsAtOnce bounds the proxy submissions one grant has in flight.
const maxSubmitsAtOnce = 16

// errQueued is how a batch's report function says "collected for the
// outcome batch": not a failure.
var errQueued = errors.New("outcome queued for the batch")

// driveBatch drives a page of the account's PENDING payouts together under
// this grant: two payment-resource calls for all of them — claim then
// submitting, and outcome then post, each a compound POST
// /v1/accounts/{id}/steps (one transaction, guard 1 once) — and one proxy
// call for all their submissions (sendAll). RAIL_SUBMITTED is committed for
// the whole batch before any of them is sent (D-4). A payout whose step was
// refused as invalid_transition (it moved under us), or whose batch got no
// usable answer, is re-read and finished alone by drive, as the recovery
// table says. The test hooks fire after each batched step, with its first
// payout; a hook armed between the two steps of a pair splits that pair
// into two calls, so that it fires where it says.
//
// The claim takes only what the account's funds cover (while_covered):
// claimed together, a payout later declined or refused would hold back
// money a later one of the batch needs, and that one would fail on funds
// where claimed after it it would be paid. So the claims stop at the first
// payout the funds do not cover, once one is claimed; it and those after it
// stay PENDING and go back to r.pending, in order, to be claimed once these
// have settled — as when claimed one at a time. driveBatch returns how many
// went back.
func (r *run) driveBatch(ps []pc.Payout) (waiting int, err error) {
	b := &batch{r: r}
	submitting := b.pair(claimSubmitting, ps, nil)
	r.pending = append(b.waiting, r.pending...)
	return len(b.waiting), b.finish(submitting)
}

// finish drives the batch's submitted payouts (submitting) on from the
// proxy submission to the posting, then the loose ones alone.
func (b *batch) finish(submitting []pc.Payout) error {
	if b.fatal != nil {
		return b.fatal
	}
	reported, outcomes := b.sendAll(submitting)
	if b.fatal != nil {
		return b.fatal
	}
	b.pair(outcomePost, reported, outcomes)
	if b.fatal != nil {
		return b.fatal
	}
	for _, p := range b.loose {
		if err := b.r.drive(p, true); err != nil {
			return err
		}
	}
	return b.leave
}

// batch is the state of one driveBatch.
type batch struct {
	r *run
	// loose are payouts to finish one at a time, after the batch.
	loose []pc.Payout
	// fatal stops the account's work at once (fenced out, grant lost, stop).
	fatal error
	// leave is set when a payout was left (a refused request): the round
	// ends once the others are done.
	leave error
	// waiting are the PENDING payouts the claim left unclaimed because the
	// funds do not cover them yet, in order.
	waiting []pc.Payout
}

// settle files a payout whose own handling failed with err.
func (b *batch) settle(p pc.Payout, err error) {
	switch {
	case err == nil || errors.Is(err, errQueued):
	case errors.Is(err, errTransient):
		b.loose = append(b.loose, p)
	case errors.Is(err, errLeave), errors.Is(err, errStepBudget):
		b.leave = err
	default:
		if b.fatal == nil {
			b.fatal = err
		}
	}
}

// stepDef is one batched step: its op, the hook point after it, and the
// state it brings a payout to when all goes well.
type stepDef struct {
	op    pc.StepOp
	after Point
	want  pc.State
}

// stepPair is two steps with nothing outside between them, which one
// compound call applies in one transaction.
type stepPair struct{ first, then stepDef }

var (
	claimSubmitting = stepPair{stepDef{pc.StepClaim, AfterClaimed, pc.Claimed}, stepDef{pc.StepSubmitting, AfterSubmitting, pc.RailSubmitted}}
	outcomePost     = stepPair{stepDef{pc.StepOutcome, AfterOutcome, pc.RailAcked}, stepDef{pc.StepPost, AfterPosted, pc.Posted}}
)

// pair runs both steps of sp on ps (items: their outcome members, for
// StepOutcome) and returns those that reached the second's state, in order:
// in one compound call, or — when a test hook is armed after the first
// step, so that it fires between the two — in two.
func (b *batch) pair(sp stepPair, ps []pc.Payout, items []pc.StepItem) []pc.Payout {
	if h := b.r.e.cfg.Hooks; h.HoldAfter != sp.first.after && h.CrashAfter != sp.first.after {
		return b.step(sp.first, &sp.then, ps, items)
	}
	mid := b.step(sp.first, nil, ps, items)
	if b.fatal != nil {
		return nil
	}
	return b.step(sp.then, nil, mid, nil)
}

// step runs one batched step s on ps (then: a second step in the same
// call, a compound step) and returns those that reached the state the call
// leads to, in order. The others end here (terminal, or RAIL_AMBIGUOUS),
// are left, or go loose — as does one a compound call left between its two
// steps, to be finished alone in the state it is in.
func (b *batch) step(s stepDef, then *stepDef, ps []pc.Payout, items []pc.StepItem) []pc.Payout {
	r := b.r
	if len(ps) == 0 {
		return nil
	}
	if err := r.check(); err != nil {
		b.fatal = err
		return nil
	}
	if items == nil {
		items = make([]pc.StepItem, len(ps))
		for i, p := range ps {
			items[i] = pc.StepItem{PayoutID: p.ID}
		}
	}
	step, name, last := string(s.op), string(s.op), s
	var thenOp pc.StepOp
	if then != nil {
		thenOp, name, last = then.op, step+"+"+string(then.op), *then
	}
	ctx, cancel := r.e.callCtx()
	start := time.Now()
	res, err := r.e.pay.PostSteps(ctx, r.account, pc.StepsRequest{Token: r.g.Token(), Holder: r.g.Holder(),
		Op: s.op, Then: thenOp, WhileCovered: s.op == pc.StepClaim, Items: items})
	cancel()
	r.e.m.stepLatency.WithLabelValues(strings.ReplaceAll(name, "+", "_") + "_batch").Observe(time.Since(start).Seconds())
	if err == nil && len(res) != len(ps) {
		r.log.Error("the payment resource answered a batch with the wrong number of items; re-reading them",
			"step", name, "items", len(ps), "answers", len(res))
		b.loose = append(b.loose, ps...)
		return nil
	}
	if err != nil {
		err = r.failed(step, "payment", ps[0], err)
		if errors.Is(err, errTransient) {
			// No usable answer: whatever landed is found by re-reading.
			b.loose = append(b.loose, ps...)
			return nil
		}
		b.settle(ps[0], err)
		return nil
	}
	r.heard("payment", step)
	var out []pc.Payout
	var first *pc.Payout
	for i, p := range ps {
		if res[i].Err != nil {
			b.settle(p, r.failed(step, "payment", p, res[i].Err))
			continue
		}
		next := res[i].Payout
		if s.op == pc.StepClaim && p.State == pc.Pending && next.State == pc.Pending {
			b.waiting = append(b.waiting, next) // not covered yet
			continue
		}
		r.e.m.steps.WithLabelValues(step, resultOK).Inc()
		if then != nil && next.State == then.want {
			r.e.m.steps.WithLabelValues(string(then.op), resultOK).Inc()
		}
		if next.State != p.State {
			r.moved = true
		}
		r.transition(name, p, next)
		if first == nil && next.State != p.State && (next.State == last.want || (then == nil && s.after != AfterClaimed)) {
			first = &next
		}
		switch {
		case next.State == last.want:
			out = append(out, next)
		case then != nil && next.State == s.want:
			b.loose = append(b.loose, next)
		}
	}
	if first != nil {
		r.hook(last.after, *first)
	}
	return out
}

// submitAnswer is the proxy's answer to one payout's submission.
type submitAnswer struct {
	rec proxyclient.Record
	err error
}

// sendAll submits every payout this grant has just marked RAIL_SUBMITTED to
// the proxy in one batch submission (POST /v1/accounts/{id}/submissions:
// guard 2 once, every intent in one transaction), then acts on each item's
// answer in order as on a single submission's: the records whose outcome is
// to be reported are returned for the outcome batch; anything else is
// handled as for a single payout. A batch fenced out stops the account's
// work; a batch refused for its input is sent again one payout at a time,
// so that each payout gets its own answer; any other failure of the call
// leaves unknown which were forwarded, and each payout is settled by asking
// the proxy first (D-4), never by sending it again.
func (b *batch) sendAll(ps []pc.Payout) ([]pc.Payout, []pc.StepItem) {
	r := b.r
	if len(ps) == 0 {
		return nil, nil
	}
	// As before every step: the claim call may have outlived the grant, or
	// put the session in jeopardy. The payouts stay RAIL_SUBMITTED, for the
	// next holder to settle (D-4).
	if err := r.check(); err != nil {
		b.fatal = err
		return nil, nil
	}
	var reported []pc.Payout
	var items []pc.StepItem
	collect := func(p pc.Payout, rec proxyclient.Record) (pc.Payout, error) {
		reported, items = append(reported, p), append(items, r.outcomeItem(p, rec))
		return p, errQueued
	}
	var answers []submitAnswer
	res, err := r.sendBatch(ps)
	switch {
	case err == nil:
		answers = make([]submitAnswer, len(ps))
		for i, it := range res {
			answers[i].rec = it.Record
			if it.Err != nil {
				answers[i].err = it.Err
			}
		}
	case problem.Has(err, problem.FencedOut):
		_, err = r.answered(ps[0], proxyclient.Record{}, err, r.apply)
		b.settle(ps[0], err)
		return nil, nil
	case proxyclient.RefusedUnforwarded(err):
		r.log.Warn("the proxy refused the batch submission for its input; sending its payouts one at a time",
			"items", len(ps), obs.KeyError, err.Error())
		answers = b.sendEach(ps)
	default:
		answers = make([]submitAnswer, len(ps))
		for i := range answers {
			answers[i].err = err
		}
	}
	b.fileAnswers(ps, answers, collect)
	return reported, items
}

// fileAnswers acts on each item's answer to the batch submission of ps, in
// order, as on a single submission's; the ones without a usable answer
// are settled together (unclear).
func (b *batch) fileAnswers(ps []pc.Payout, answers []submitAnswer, collect func(pc.Payout, proxyclient.Record) (pc.Payout, error)) {
	r := b.r
	// While the proxy's rail is paused it forwards one item of a batch as
	// its probe and answers the others unforwarded: those say nothing of
	// the rail one by one. They count once toward the executor's rail
	// pause, and not at all when an item brought the rail's own answer.
	railAnswer, unforwarded := false, false
	for _, a := range answers {
		railAnswer = railAnswer || (a.err == nil && railAnswered(a.rec))
	}
	var unclear []pc.Payout
	var unclearErr error
	for i, p := range ps {
		err := answers[i].err
		switch {
		case noUsableAnswer(err):
			unclear = append(unclear, p)
			unclearErr = cmp.Or(unclearErr, err)
			continue
		case proxyclient.PausedUnforwarded(err):
			unforwarded = unforwarded || !proxyclient.ShuttingDown(err)
			next, err := r.unforwarded(r.log.With("step", "submit", obs.KeyPayoutID, p.ID), p, err, false)
			b.file(p, next, err)
			continue
		}
		next, err := r.answered(p, answers[i].rec, err, collect)
		b.file(p, next, err)
	}
	if unforwarded && !railAnswer {
		r.e.railAnswer(r.log, false)
	}
	if len(unclear) > 0 {
		b.unclear(unclear, unclearErr, collect)
	}
}

// file files a payout the batch's submission handled as a single
// submission's answer would be: one not done yet, and not ended by an
// error, is finished alone (a refusal, an unclear answer).
func (b *batch) file(p, next pc.Payout, err error) {
	if err == nil && !next.State.Terminal() && next.State != pc.RailAmbiguous {
		b.loose = append(b.loose, next)
		return
	}
	b.settle(p, err)
}

// unclear settles the payouts of a batch submission that got no usable
// answer for them (no connection, a timeout, a 5xx, an item answered
// unavailable): whether they were forwarded is unknown, so each is settled
// from the proxy's record (D-4), never sent again. They share one wait for
// the outcomes to be recorded. Once it has passed, each remaining payout is
// asked about once (one forwarded without outcome is then RAIL_AMBIGUOUS),
// until one must be left RAIL_SUBMITTED (the proxy holds no record of it or
// does not answer): the rest are then left for the next pass without
// asking, so that a proxy that does not answer holds the account for one
// wait and one call, not one per payout.
func (b *batch) unclear(ps []pc.Payout, err error, collect func(pc.Payout, proxyclient.Record) (pc.Payout, error)) {
	r := b.r
	r.e.m.steps.WithLabelValues("submit", resultTransient).Add(float64(len(ps)))
	r.log.Warn("the batch submission got no usable answer; asking the proxy what happened to each payout (never resent)",
		"items", len(ps), obs.KeyError, err.Error())
	r.e.railAnswer(r.log, false)
	deadline := time.Now().Add(unknownSubmitWait)
	left := false
	for i, p := range ps {
		if b.fatal != nil {
			return
		}
		if left && time.Now().After(deadline) {
			r.log.Warn("left the rest of the unclear batch RAIL_SUBMITTED for the next pass", "left", len(ps)-i)
			return
		}
		next, err := r.settleUnknown(p, deadline, collect)
		left = left || errors.Is(err, errLeave)
		b.file(p, next, err)
	}
}

// sendEach submits each payout on its own, at most maxSubmitsAtOnce at a
// time.
func (b *batch) sendEach(ps []pc.Payout) []submitAnswer {
	answers := make([]submitAnswer, len(ps))
	sem := make(chan struct{}, maxSubmitsAtOnce)
	var wg sync.WaitGroup
	for i, p := range ps {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			rec, err := b.r.send(p, false)
			answers[i] = submitAnswer{rec, err}
		}()
	}
	wg.Wait()
	return answers
}

// reread is the payout as the payment resource now holds it; its error
// is classified as a step's (errTransient: try again later).
func (r *run) reread(p pc.Payout) (pc.Payout, error) {
	ctx, cancel := r.e.callCtx()
	defer cancel()
	fresh, err := r.e.pay.Payout(ctx, p.ID)
	if err != nil {
		return p, r.failed("reread", "payment", p, err)
	}
	r.heard("payment", "reread")
	if fresh.State != p.State {
		// A step of this grant whose answer was lost landed after all:
		// no one else writes the payout while the grant holds. It moved
		// the payout, and a final state is counted as any other.
		r.moved = true
		r.transition("reread", p, fresh)
	}
	return fresh, nil
}
