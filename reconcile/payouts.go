package reconcile

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// ---- payouts (INV-01, INV-02, INV-03, INV-07, cross-service) ----

func inFlight(s pc.State) bool { return s == pc.Claimed || s == pc.RailSubmitted || s == pc.RailAcked }

// checkPayouts streams every payout (with its history's tokens), every
// submission attempt and the rail's settlement report, each sorted by
// payout id (the rail's by client reference, which is a fixed prefix plus
// the payout id, D-10), and merges them: each payout is checked against
// what the proxy and the rail hold for it without a round trip per payout.
// The streams are read page by page, each while the previous page is
// checked, so memory is bounded by the page size, the payouts in flight
// and the findings, never by the number of payouts. The pages of the
// three streams are read at different moments: every per-payout finding
// is read again, fresh and in write order, before it is reported
// (checkPayout), and so is every rail payment the merge matched to no
// payout (reportOrphans).
func (r *Reconciler) checkPayouts(ctx context.Context, rep *Report, grants *grantIndex) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ri, err := r.openRail(ctx, rep)
	if err != nil {
		return err
	}
	subs := openStream(ctx, "the rail proxy's submissions", func(d proxyclient.SubmissionDigest) string { return d.PayoutID },
		func(ctx context.Context, cursor string) ([]proxyclient.SubmissionDigest, string, error) {
			page, err := r.c.Proxy.SubmissionDigests(ctx, cursor, r.opts.BulkPageSize)
			return page.Items, page.Next, err
		})
	payouts := openStream(ctx, "the payouts", func(d pc.PayoutDigest) string { return d.ID },
		func(ctx context.Context, cursor string) ([]pc.PayoutDigest, string, error) {
			page, err := r.c.Payment.PayoutDigests(ctx, cursor, r.opts.BulkPageSize)
			return page.Items, page.Next, err
		})
	pool := r.startChecks(ctx, rep, ri, grants)
	now := r.opts.Now()
	// Forwarded submissions of payouts the list does not hold: created
	// after it went by (the next pass checks them), or unknown to paydb
	// (reportUnknownPayouts). At most MaxFindings payouts are kept; those
	// past it are counted in a note.
	unknown := map[string][]proxyclient.Record{}
	overflow := 0
	skip := func(d proxyclient.SubmissionDigest) {
		rec := d.Record()
		if !rec.Forwarded() {
			return
		}
		if _, seen := unknown[d.PayoutID]; seen || len(unknown) < r.opts.MaxFindings {
			unknown[d.PayoutID] = append(unknown[d.PayoutID], rec)
			return
		}
		overflow++
	}
	flying := map[string][]string{} // account -> payouts seen in flight
	unsummed := 0                   // digests without their ledger sums
	unhistoried := 0                // digests without the state their history ends in
	for {
		d, ok, err := payouts.head()
		if err != nil {
			return pool.stop(err)
		}
		if !ok {
			break
		}
		payouts.next()
		p := d.Payout()
		rep.Scanned.Payouts++
		if inFlight(p.State) {
			flying[p.AccountID] = append(flying[p.AccountID], p.ID)
		}
		if d.Ledger == nil {
			unsummed++
		} else {
			checkPosting(rep, p, *d.Ledger)
		}
		if d.HistoryState == "" {
			unhistoried++
		} else if err := r.checkStateInHistory(ctx, rep, p, d.HistoryState, d.HistoryJumps); err != nil {
			return pool.stop(err)
		}
		recs, err := subs.takeUpTo(p.ID, skip)
		if err != nil {
			return pool.stop(err)
		}
		pays, known, err := ri.take(p)
		if err != nil {
			return pool.stop(err)
		}
		j := payoutJob{p: p, now: now, historyRegresses: tokensRegress(d.EventTokens), pays: pays, paysKnown: known}
		for _, rec := range recs {
			j.subs = append(j.subs, rec.Record())
		}
		if !pool.submit(j) {
			break
		}
	}
	if err := pool.stop(nil); err != nil {
		return err
	}
	if err := subs.rest(skip); err != nil {
		return err
	}
	if err := r.reportUnknownPayouts(ctx, rep, unknown, grants); err != nil {
		return err
	}
	if unsummed > 0 {
		rep.note("%d payouts came without their ledger sums (a payment resource older than this reconciler): their postings were not matched (%s)", unsummed, CheckPayoutPosting)
	}
	if unhistoried > 0 {
		rep.note("%d payouts came without the state their history ends in (a payment resource older than this reconciler): their states were not matched to their histories (%s)", unhistoried, CheckStateNotInHistory)
	}
	if overflow > 0 {
		rep.note("%d more forwarded submissions name payouts the payouts list did not hold: not checked in this pass (only the first %d such payouts are)", overflow, r.opts.MaxFindings)
	}
	if err := ri.drain(); err != nil {
		return err
	}
	if err := r.checkInFlight(ctx, rep, flying); err != nil {
		return err
	}
	return r.reportOrphans(ctx, rep, ri)
}

// checkPosting: a POSTED payout's ledger holds exactly its posting, one
// group of two entries (-amount on its account, +amount on
// payout-clearing), and a payout in any other state has no entry at all
// (INV-03: the money the ledger says left is the money that left). The
// digest reads the payout and its entries in one statement, and a posting
// commits with the payout's move to POSTED, so a moving system cannot make
// this fire: it needs no second read.
func checkPosting(rep *Report, p pc.Payout, l pc.LedgerDigest) {
	objs := map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "state": string(p.State), "amount": p.Amount,
		"entries": l.Entries, "groups": l.Groups, "account_sum": l.Account, "clearing_sum": l.Clearing}
	switch {
	case p.State == pc.Posted && !l.Posted(p.Amount):
		rep.add(CheckPayoutPosting, objs,
			"payout %s is POSTED for %d, but the ledger entries naming it are %d in %d group(s), %+d on %s and %+d on %s; its posting is one group of two entries, %d on the account and %+d on %s",
			p.ID, p.Amount, l.Entries, l.Groups, l.Account, p.AccountID, l.Clearing, pc.ClearingAccount, -p.Amount, p.Amount, pc.ClearingAccount)
	case p.State != pc.Posted && l.Entries > 0:
		rep.add(CheckPayoutPosting, objs,
			"payout %s is %s, but %d ledger entries name it (%+d on %s, %+d on %s): the ledger moved money for a payout that was not posted",
			p.ID, p.State, l.Entries, l.Account, p.AccountID, l.Clearing, pc.ClearingAccount)
	}
}

// checkStateInHistory: the payment resource changes a payout's state only
// through its transition table, and records each change it makes as an
// event in the same statement (INV-08), so each change starts where the
// one before it ended, and the payout's state is where the last one
// ended. A state written outside the table (an UPDATE by hand or by a
// script) shows as one or the other: a state that is not where the
// history ends while nothing has moved the payout since (history), and
// once the payment resource has moved it on (an executor claimed the
// FAILED payout put back to PENDING, and paid it again), a change that
// starts from a state the history never reached (jumps: the payout's
// history is then read to name the first such change; the history is
// append-only, so it is still there). terminal_state_left, which reads
// recorded changes, sees neither. The digest reads the payout and its
// events in one statement, so a moving system cannot make this fire.
func (r *Reconciler) checkStateInHistory(ctx context.Context, rep *Report, p pc.Payout, history pc.State, jumps bool) error {
	if p.State == history && !jumps {
		return nil
	}
	objs := map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "key": lockKey(p.AccountID),
		"state": string(p.State), "history_state": string(history)}
	if !jumps {
		rep.add(CheckStateNotInHistory, objs,
			"payout %s is %s, but its history ends in %s: its state was written outside the payment resource, and no change to it is recorded",
			p.ID, p.State, history)
		return nil
	}
	events, err := r.payoutEvents(ctx, p.ID)
	if err != nil {
		return err
	}
	for i := 1; i < len(events); i++ {
		if prev, ev := events[i-1], events[i]; ev.FromState != prev.ToState {
			objs["event_id"], objs["from_state"], objs["previous_to_state"] = ev.ID, string(ev.FromState), string(prev.ToState)
			break
		}
	}
	rep.add(CheckStateNotInHistory, objs,
		"payout %s's history jumps: change %v starts from %v where the change before it ended in %v; its state was written outside the payment resource in between, and that write is recorded nowhere",
		p.ID, objs["event_id"], objs["from_state"], objs["previous_to_state"])
	return nil
}

// tokensRegress reports whether a history's tokens, in event order, ever
// go below the highest seen before them (changes made under no token, 0,
// do not count): the condition checkClaimHistory reports.
func tokensRegress(tokens []int64) bool {
	var high int64
	for _, t := range tokens {
		if t == 0 {
			continue
		}
		if t < high {
			return true
		}
		high = t
	}
	return false
}

// payoutJob is one payout and what the streams hold for it.
type payoutJob struct {
	p                pc.Payout
	now              time.Time // the pass's clock, for ages
	historyRegresses bool
	subs             []proxyclient.Record
	pays             []railclient.Payment
	paysKnown        bool // false: ask the rail for this payout
}

// checkPool checks payouts on up to Options.Workers goroutines: with the
// streams a check is work, not waiting, except for the suspects read again
// and, with --rail-per-payout, the rail lookups. The first error stops it.
type checkPool struct {
	jobs   chan payoutJob
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	once   sync.Once
	first  error
}

func (r *Reconciler) startChecks(ctx context.Context, rep *Report, ri *railIndex, grants *grantIndex) *checkPool {
	cp := &checkPool{jobs: make(chan payoutJob, 4*r.opts.Workers)}
	cp.ctx, cp.cancel = context.WithCancel(ctx)
	for range r.opts.Workers {
		cp.wg.Add(1)
		go func() {
			defer cp.wg.Done()
			for j := range cp.jobs {
				if cp.ctx.Err() != nil {
					continue
				}
				if err := r.checkJob(cp.ctx, rep, j, ri, grants); err != nil {
					cp.fail(err)
				}
			}
		}()
	}
	return cp
}

func (cp *checkPool) fail(err error) { cp.once.Do(func() { cp.first = err; cp.cancel() }) }

// submit queues a job; false once the pool has stopped on an error.
func (cp *checkPool) submit(j payoutJob) bool {
	select {
	case cp.jobs <- j:
		return true
	case <-cp.ctx.Done():
		return false
	}
}

// stop waits for the queued checks and returns the first error (err when
// it is not nil: the checks are abandoned).
func (cp *checkPool) stop(err error) error {
	if err != nil {
		cp.fail(err)
	}
	close(cp.jobs)
	cp.wg.Wait()
	var ended error
	if cp.first == nil && cp.ctx.Err() != nil {
		ended = cannotRun("check the payouts", cp.ctx.Err())
	}
	cp.cancel()
	if cp.first != nil {
		return cp.first
	}
	return ended
}

func (r *Reconciler) checkJob(ctx context.Context, rep *Report, j payoutJob, ri *railIndex, grants *grantIndex) error {
	if p := j.p; p.State == pc.RailAmbiguous {
		since, over, err := r.ambiguousLongerThan(ctx, p, j.now, r.opts.AmbiguitySLA)
		if err != nil {
			return err
		}
		if over {
			age := j.now.Sub(since)
			rep.add(CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "client_ref": p.ClientRef, "amount": p.Amount, "ambiguous_since": since.UTC(), "age_seconds": int64(age.Seconds())},
				"payout %s has been RAIL_AMBIGUOUS for %s, longer than the SLA %s: the rail has not given final evidence; an operator must decide (abandon to finance)", p.ID, age.Round(time.Second), r.opts.AmbiguitySLA)
		}
	}
	if j.historyRegresses {
		// Read the whole history for the finding's evidence.
		if err := r.checkClaimHistory(ctx, rep, j.p); err != nil {
			return err
		}
	}
	pays := j.pays
	if !j.paysKnown {
		var err error
		if pays, err = ri.fresh(ctx, j.p.ClientRef); err != nil {
			return cannotRun("ask the rail about "+j.p.ClientRef, err)
		}
	}
	return r.checkPayout(ctx, rep, j.p, j.subs, pays, grants)
}

// ambiguousSince bounds from below when a payout's ending became unknown:
// its entry into RAIL_AMBIGUOUS (ambiguousAt) came at its submission or
// later (a resubmission by a later holder, D-4).
func ambiguousSince(p pc.Payout) time.Time {
	switch {
	case p.SubmittedAt != nil:
		return *p.SubmittedAt
	case p.ClaimedAt != nil:
		return *p.ClaimedAt
	default:
		return p.CreatedAt
	}
}

// ambiguousLongerThan reports whether payout p (RAIL_AMBIGUOUS) has been
// so for longer than d at now, and since when. Its submission bounds that
// moment from below, and spares reading the history of a payout younger
// than d; otherwise the history says (ambiguousAt).
func (r *Reconciler) ambiguousLongerThan(ctx context.Context, p pc.Payout, now time.Time, d time.Duration) (time.Time, bool, error) {
	if since := ambiguousSince(p); now.Sub(since) <= d {
		return since, false, nil
	}
	since, err := r.ambiguousAt(ctx, p)
	return since, err == nil && now.Sub(since) > d, err
}

// ambiguousAt is when payout p last entered RAIL_AMBIGUOUS, from its
// history, as the payment resource's abandon gate measures it;
// ambiguousSince(p), never later, when the history has no such change.
func (r *Reconciler) ambiguousAt(ctx context.Context, p pc.Payout) (time.Time, error) {
	events, err := r.payoutEvents(ctx, p.ID)
	if err != nil {
		return time.Time{}, err
	}
	var at time.Time
	for _, ev := range events {
		if ev.ToState == pc.RailAmbiguous && ev.At.After(at) {
			at = ev.At
		}
	}
	if at.IsZero() {
		return ambiguousSince(p), nil
	}
	return at, nil
}

// checkClaimHistory: a payout's accepted changes carry non-decreasing
// tokens (INV-01): each later holder's grant is newer.
func (r *Reconciler) checkClaimHistory(ctx context.Context, rep *Report, p pc.Payout) error {
	events, err := r.payoutEvents(ctx, p.ID)
	if err != nil {
		return err
	}
	var (
		prev     pc.PayoutEvent
		havePrev bool
	)
	for _, ev := range events {
		if ev.Token == 0 {
			continue
		}
		if havePrev && ev.Token < prev.Token {
			rep.add(CheckClaimTokenOrder, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "key": lockKey(p.AccountID),
				"event_id": ev.ID, "token": ev.Token, "holder": string(ev.Holder), "to_state": string(ev.ToState),
				"previous_event_id": prev.ID, "previous_token": prev.Token, "previous_holder": string(prev.Holder)},
				"payout %s moved to %s under token %d after an earlier change under token %d: an older holder wrote after a newer one", p.ID, ev.ToState, ev.Token, prev.Token)
			return nil // one finding per payout
		}
		if !havePrev || ev.Token >= prev.Token {
			prev, havePrev = ev, true
		}
	}
	return nil
}

// checkTerminalLeft: POSTED, FAILED and ABANDONED are final (INV-08); the
// transition table has no change out of them, so one in a payout's
// history is finished work executed again (a replay, a cleanup job) that
// the table did not stop. rejected_transition reports the attempts the
// table refused; this reports those that landed, read from the payment
// resource's list of such changes (empty while the table holds: one
// request a pass). Each payout is reported once, with its first such
// change as evidence.
func (r *Reconciler) checkTerminalLeft(ctx context.Context, rep *Report) error {
	reported := map[string]bool{}
	var after int64
	for {
		page, err := r.c.Payment.TerminalExits(ctx, after, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the payment resource's changes out of a final state", err)
		}
		for _, ev := range page.Items {
			after = max(after, ev.ID)
			if reported[ev.PayoutID] {
				continue
			}
			reported[ev.PayoutID] = true
			p, err := r.c.Payment.Payout(ctx, ev.PayoutID)
			if err != nil {
				return cannotRun("read payout "+ev.PayoutID, err)
			}
			rep.add(CheckTerminalLeft, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "key": lockKey(p.AccountID), "state": string(p.State),
				"event_id": ev.ID, "from_state": string(ev.FromState), "to_state": string(ev.ToState), "token": ev.Token, "holder": string(ev.Holder),
				"actor": ev.Actor, "reason": ev.Reason, "at": ev.At.UTC()},
				"payout %s left the final state %s for %s under token %d (actor %q, reason %q): finished work was executed again",
				p.ID, ev.FromState, ev.ToState, ev.Token, ev.Actor, ev.Reason)
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
	}
}

// checkInFlight: one holder at a time works an account (INV-01). An
// executor moves a page of an account's payouts under one grant, and a
// later grant carries on from an expired one, so several payouts in flight
// at once are normal; what two holders at once leave is an interleaving:
// across the account's payouts, a change under a token lower than an
// earlier change's. Every accepted change of an account takes the
// account's row first, so event ids order them as they committed. Only
// accounts with two or more payouts still in CLAIMED, RAIL_SUBMITTED or
// RAIL_ACKED are read (suspects are read again: a payout can finish while
// the list is being paged); claim_token_order covers a single payout.
func (r *Reconciler) checkInFlight(ctx context.Context, rep *Report, flying map[string][]string) error {
	for account, ids := range flying {
		if len(ids) < 2 {
			continue
		}
		var (
			still  []string
			events []pc.PayoutEvent
		)
		for _, id := range ids {
			p, err := r.c.Payment.Payout(ctx, id)
			if err != nil {
				return cannotRun("read payout "+id, err)
			}
			if !inFlight(p.State) {
				continue
			}
			still = append(still, id)
			evs, err := r.payoutEvents(ctx, id)
			if err != nil {
				return err
			}
			events = append(events, evs...)
		}
		if len(still) < 2 {
			continue
		}
		slices.SortFunc(events, func(a, b pc.PayoutEvent) int { return cmp.Compare(a.ID, b.ID) })
		var top pc.PayoutEvent
		for _, ev := range events {
			if ev.Token == 0 {
				continue
			}
			if ev.Token < top.Token {
				rep.add(CheckInFlightPerAccount, map[string]any{"account_id": account, "key": lockKey(account), "payouts": still,
					"payout_id": ev.PayoutID, "event_id": ev.ID, "token": ev.Token, "holder": string(ev.Holder), "to_state": string(ev.ToState),
					"previous_payout_id": top.PayoutID, "previous_event_id": top.ID, "previous_token": top.Token, "previous_holder": string(top.Holder)},
					"account %s: payout %s moved to %s under token %d after payout %s moved under token %d: two holders worked the account together",
					account, ev.PayoutID, ev.ToState, ev.Token, top.PayoutID, top.Token)
				break
			}
			top = ev
		}
	}
	return nil
}

// payoutEvents reads a payout's whole history.
func (r *Reconciler) payoutEvents(ctx context.Context, id string) ([]pc.PayoutEvent, error) {
	var (
		after int64
		out   []pc.PayoutEvent
	)
	for {
		page, err := r.c.Payment.PayoutEvents(ctx, id, after, r.opts.PageSize)
		if err != nil {
			return nil, cannotRun("read the history of payout "+id, err)
		}
		for _, ev := range page.Items {
			after = max(after, ev.ID)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		if n, err := strconv.ParseInt(page.Next, 10, 64); err == nil && n > after {
			after = n
		}
	}
}

// reportUnknownPayouts reports the submissions the proxy forwarded for
// payouts paydb does not hold, read again now (a payout created after the
// list went by is left for the next pass): paydb cannot account for what
// the rail may have paid (submission_state_mismatch), and the submissions
// are checked as any other against the grant log (INV-07) and for being
// more than one (INV-02).
func (r *Reconciler) reportUnknownPayouts(ctx context.Context, rep *Report, unknown map[string][]proxyclient.Record, grants *grantIndex) error {
	for _, id := range slices.Sorted(maps.Keys(unknown)) {
		forwarded := unknown[id]
		_, err := r.c.Payment.Payout(ctx, id)
		switch {
		case err == nil:
			continue
		case !isNotFound(err):
			return cannotRun("read payout "+id, err)
		}
		first := forwarded[0]
		// When it was forwarded, for the grant log's retention: the intent
		// is written before the rail is called.
		full, err := r.c.Proxy.Get(ctx, id)
		if err != nil && !isNotFound(err) {
			return cannotRun("read the submission of payout "+id, err)
		}
		var since *time.Time
		if err == nil && !full.CreatedAt.IsZero() {
			since = &full.CreatedAt
		}
		objs := map[string]any{"payout_id": id, "account_id": first.AccountID, "submission": fmt.Sprintf("submission %d outcome %s", first.ID, orNone(string(first.Outcome))), "token": first.FenceToken}
		rep.add(CheckSubmissionStateMismatch, objs,
			"the proxy forwarded payout %s (submission %d, token %d, outcome %s), which paydb does not hold: what the rail paid for it is in no ledger", id, first.ID, first.FenceToken, orNone(string(first.Outcome)))
		if len(forwarded) > 1 {
			rep.add(CheckForwardedSubmissions, map[string]any{"payout_id": id, "forwarded": len(forwarded)},
				"the proxy holds %d forwarded submissions for payout %s, which paydb does not hold", len(forwarded), id)
		}
		p := pc.Payout{ID: id, AccountID: first.AccountID, SubmittedAt: since}
		for _, rec := range forwarded {
			if err := r.checkSubmissionGrant(ctx, rep, p, rec, grants); err != nil {
				return err
			}
		}
	}
	return nil
}
