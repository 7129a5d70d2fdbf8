package reconcile

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// The services are read one after another, never in one snapshot, while
// executors keep working. Every check is therefore written so that a
// correct system cannot produce a finding from the order of the reads:
// either the reads follow the order in which a correct system writes
// (lock before guards, paydb before proxy, proxy before rail), or a
// suspect is read again, fresh and in that order, before it is reported.

// check runs every check into rep.
func (r *Reconciler) check(ctx context.Context, rep *Report) error {
	// Guards first, then the lock service: a grant is issued before any
	// guard can store its token, so a correct system always shows
	// lock_high_token >= every fence read before it.
	payHigh, err := r.c.Payment.HighFence(ctx)
	if err != nil {
		return cannotRun("read the payment resource's highest fence", err)
	}
	proxyHigh, err := r.c.Proxy.HighFence(ctx)
	if err != nil {
		return cannotRun("read the rail proxy's highest fence", err)
	}
	lockHigh, err := r.c.Lock.HighToken(ctx)
	if err != nil {
		return cannotRun("read the lock service's highest token", err)
	}
	rep.PayDBFence, rep.ProxyFence, rep.LockHighToken = payHigh, proxyHigh, lockHigh
	rep.HighestFence = max(payHigh, proxyHigh)
	if rep.HighestFence > lockHigh {
		rep.add(CheckLockRewound, map[string]any{
			"highest_fence": rep.HighestFence, "paydb_high_fence": payHigh, "proxy_high_fence": proxyHigh, "lock_high_token": lockHigh,
		}, "the guards store fence %d but the lock service has issued only up to %d: it was restored or rewound and will re-issue tokens the guards have seen (bump it above %d, DESIGN D-13)",
			rep.HighestFence, lockHigh, rep.HighestFence)
	}

	grants := &grantIndex{svc: r.c.Lock, limit: r.opts.PageSize, keys: map[fencing.Token]string{}, sessions: map[fencing.Token]string{}}
	if err := grants.load(ctx); err != nil {
		return cannotRun("read the lock service's grant log", err)
	}

	ledger, err := r.scanLedger(ctx, rep, grants)
	if err != nil {
		return err
	}
	fences, err := r.checkAccounts(ctx, rep, ledger)
	if err != nil {
		return err
	}
	if err := r.checkHighWater(ctx, rep, fences); err != nil {
		return err
	}
	if err := r.checkPayouts(ctx, rep, grants); err != nil {
		return err
	}
	if err := r.checkSafetyEvents(ctx, rep); err != nil {
		return err
	}
	rep.Scanned.Grants = len(grants.keys)
	return nil
}

// grantIndex is the grant log as token -> key. It is the one structure
// that grows with the history (one small entry per grant).
type grantIndex struct {
	svc   LockService
	limit int
	keys  map[fencing.Token]string
	// sessions is the session each token was granted to.
	sessions map[fencing.Token]string
	last     fencing.Token
}

// load reads the grant log from where it stopped last time.
func (g *grantIndex) load(ctx context.Context) error {
	for {
		items, next, err := g.svc.Grants(ctx, g.last, g.limit)
		if err != nil {
			return err
		}
		for _, it := range items {
			g.keys[it.Token] = it.Key
			g.sessions[it.Token] = it.SessionID
			g.last = max(g.last, it.Token)
		}
		if next == 0 || len(items) == 0 {
			return nil
		}
		g.last = max(g.last, next)
	}
}

// granted reports whether the lock service granted token for key,
// reading grants issued since the index was loaded when the token is
// newer than the index.
func (g *grantIndex) granted(ctx context.Context, token fencing.Token, key string) (bool, string, error) {
	if k, ok := g.keys[token]; ok {
		return k == key, k, nil
	}
	if token > g.last {
		if err := g.load(ctx); err != nil {
			return false, "", err
		}
		if k, ok := g.keys[token]; ok {
			return k == key, k, nil
		}
	}
	return false, "", nil
}

// ---- ledger (INV-03, INV-07) ----

type openGroup struct {
	sum      int64
	firstID  int64
	accounts map[string]bool
}

type ledgerScan struct {
	open map[string]*openGroup // groups whose running sum is not zero
	sums map[string]int64      // account -> sum of its entries
}

// customerAccount is the account whose lock a payout's ledger entry was
// posted under: the leg that is not the clearing account.
func customerAccount(e pc.LedgerEntry) string {
	if e.AccountID == pc.ClearingAccount {
		return e.CounterpartyAccountID
	}
	return e.AccountID
}

// scanLedger reads the whole ledger once, page by page. Groups are kept
// only while their running sum is not zero (the entries of a group are
// written together, so few are open at once).
func (r *Reconciler) scanLedger(ctx context.Context, rep *Report, grants *grantIndex) (*ledgerScan, error) {
	ls := &ledgerScan{open: map[string]*openGroup{}, sums: map[string]int64{}}
	var grantErr error
	err := r.eachLedgerEntry(ctx, func(e pc.LedgerEntry) {
		rep.Scanned.LedgerEntries++
		ls.sums[e.AccountID] += e.Amount
		g := ls.open[e.GroupID]
		if g == nil {
			g = &openGroup{firstID: e.ID, accounts: map[string]bool{}}
			ls.open[e.GroupID] = g
		}
		g.sum += e.Amount
		g.accounts[e.AccountID] = true
		if g.sum == 0 {
			delete(ls.open, e.GroupID)
		}
		if e.PayoutID != "" && grantErr == nil {
			grantErr = r.checkLedgerGrant(ctx, rep, e, grants)
		}
	})
	if err != nil {
		return nil, err
	}
	if grantErr != nil {
		return nil, grantErr
	}
	if len(ls.open) > 0 {
		if err := r.recheckGroups(ctx, rep, ls.open); err != nil {
			return nil, err
		}
	}
	return ls, nil
}

func (r *Reconciler) eachLedgerEntry(ctx context.Context, fn func(pc.LedgerEntry)) error {
	var after int64
	for {
		page, err := r.c.Payment.Ledger(ctx, after, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the ledger", err)
		}
		for _, e := range page.Items {
			fn(e)
			after = max(after, e.ID)
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		if n, err := strconv.ParseInt(page.Next, 10, 64); err == nil && n > after {
			after = n
		}
	}
}

// recheckGroups sums the suspect groups again over a second full read:
// every entry of a group seen in the first read had committed before the
// second began, so the second read sees each suspect group whole.
func (r *Reconciler) recheckGroups(ctx context.Context, rep *Report, open map[string]*openGroup) error {
	sums := make(map[string]int64, len(open))
	counts := make(map[string]int, len(open))
	err := r.eachLedgerEntry(ctx, func(e pc.LedgerEntry) {
		if _, ok := open[e.GroupID]; ok {
			sums[e.GroupID] += e.Amount
			counts[e.GroupID]++
		}
	})
	if err != nil {
		return err
	}
	for id, g := range open {
		if sums[id] == 0 {
			continue
		}
		accts := make([]string, 0, len(g.accounts))
		for a := range g.accounts {
			accts = append(accts, a)
		}
		rep.add(CheckLedgerGroupSum, map[string]any{"group_id": id, "sum": sums[id], "entries": counts[id], "first_entry_id": g.firstID, "accounts": accts},
			"ledger group %s sums to %d, not zero, over %d entries: money appeared or disappeared", id, sums[id], counts[id])
	}
	return nil
}

// checkLedgerGrant: a payout's ledger entry carries a token the lock
// service granted for that payout's account (INV-07).
func (r *Reconciler) checkLedgerGrant(ctx context.Context, rep *Report, e pc.LedgerEntry, grants *grantIndex) error {
	key := lockKey(customerAccount(e))
	objs := map[string]any{"entry_id": e.ID, "group_id": e.GroupID, "payout_id": e.PayoutID, "account_id": e.AccountID, "token": e.Token, "key": key}
	if e.Token == 0 {
		rep.add(CheckLedgerWithoutGrant, objs, "ledger entry %d of payout %s carries no token: it was posted outside any grant", e.ID, e.PayoutID)
		return nil
	}
	ok, other, err := grants.granted(ctx, e.Token, key)
	if err != nil {
		return cannotRun("read the lock service's grant log", err)
	}
	switch {
	case ok:
	case other != "":
		objs["granted_key"] = other
		rep.add(CheckLedgerWithoutGrant, objs, "ledger entry %d of payout %s was posted with token %d, which the lock service granted for %s, not %s", e.ID, e.PayoutID, e.Token, other, key)
	default:
		rep.add(CheckLedgerWithoutGrant, objs, "ledger entry %d of payout %s was posted with token %d, which the lock service's grant log does not contain", e.ID, e.PayoutID, e.Token)
	}
	return nil
}

// ---- accounts: balance == sum of entries (INV-03) ----

// checkAccounts compares every balance with the ledger read before it and
// returns each account's fence for the high-water check.
func (r *Reconciler) checkAccounts(ctx context.Context, rep *Report, ls *ledgerScan) (map[string]fencing.Token, error) {
	fences := map[string]fencing.Token{}
	drift := map[string]int64{} // account -> balance seen
	after := ""
	for {
		page, err := r.c.Payment.Accounts(ctx, after, r.opts.PageSize)
		if err != nil {
			return nil, cannotRun("read the accounts", err)
		}
		for _, a := range page.Items {
			rep.Scanned.Accounts++
			fences[a.ID] = a.FenceToken
			if a.Balance != ls.sums[a.ID] {
				drift[a.ID] = a.Balance
			}
			after = a.ID
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		after = page.Next
	}
	if len(drift) == 0 {
		return fences, nil
	}
	// A posting may have landed between the ledger read and the account
	// read. Read each suspect's balance, the whole ledger, and the balance
	// again: when the balance did not move meanwhile, the sum is exact.
	before := map[string]int64{}
	for id := range drift {
		a, err := r.c.Payment.Account(ctx, id)
		if err != nil {
			return nil, cannotRun("read account "+id, err)
		}
		before[id] = a.Balance
	}
	sums := map[string]int64{}
	counts := map[string]int{}
	err := r.eachLedgerEntry(ctx, func(e pc.LedgerEntry) {
		if _, ok := drift[e.AccountID]; ok {
			sums[e.AccountID] += e.Amount
			counts[e.AccountID]++
		}
	})
	if err != nil {
		return nil, err
	}
	for id := range drift {
		a, err := r.c.Payment.Account(ctx, id)
		if err != nil {
			return nil, cannotRun("read account "+id, err)
		}
		if a.Balance != before[id] {
			rep.note("account %s moved while its balance was being checked; checked again next pass", id)
			continue
		}
		if a.Balance != sums[id] {
			rep.add(CheckBalanceDrift, map[string]any{"account_id": id, "balance": a.Balance, "ledger_sum": sums[id], "entries": counts[id], "drift": a.Balance - sums[id]},
				"account %s has balance %d but its %d ledger entries sum to %d (drift %d)", id, a.Balance, counts[id], sums[id], a.Balance-sums[id])
		}
	}
	return fences, nil
}

// ---- proxy high-water vs paydb fence (INV-04) ----

// checkHighWater: every holder writes paydb (claim, submitting) before it
// calls the proxy with the same token, so the proxy's high-water for an
// account can never be above paydb's fence; when it is, paydb was restored
// from an older backup or written around.
func (r *Reconciler) checkHighWater(ctx context.Context, rep *Report, fences map[string]fencing.Token) error {
	after := ""
	for {
		page, err := r.c.Proxy.HighWater(ctx, after, r.opts.PageSize)
		if err != nil {
			return cannotRun("read the rail proxy's high-water marks", err)
		}
		for _, hw := range page.Items {
			rep.Scanned.HighWater++
			after = hw.AccountID
			fence, known := fences[hw.AccountID]
			if known && hw.Token <= fence {
				continue
			}
			// Read paydb again, after the proxy (the order a holder writes in).
			a, err := r.c.Payment.Account(ctx, hw.AccountID)
			switch {
			case isNotFound(err):
				rep.add(CheckHighWaterAboveFence, map[string]any{"account_id": hw.AccountID, "high_water": hw.Token, "high_water_holder": string(hw.Holder), "paydb_fence": 0},
					"the proxy holds high-water %d for account %s, which paydb does not know", hw.Token, hw.AccountID)
				continue
			case err != nil:
				return cannotRun("read account "+hw.AccountID, err)
			}
			if hw.Token > a.FenceToken {
				rep.add(CheckHighWaterAboveFence, map[string]any{"account_id": hw.AccountID, "key": lockKey(hw.AccountID), "high_water": hw.Token, "high_water_holder": string(hw.Holder), "paydb_fence": a.FenceToken, "paydb_fence_holder": string(a.FenceHolder)},
					"the proxy's high-water %d for account %s is above paydb's fence %d: paydb was restored from an older backup or written around the guard", hw.Token, hw.AccountID, a.FenceToken)
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		after = page.Next
	}
}

// ---- payouts (INV-01, INV-02, INV-03, INV-07, cross-service) ----

// railIndex answers "which rail payments carry this client reference".
// With the settlement report it is a map (the rail serves the report in one
// piece); without it, it asks the rail per reference.
type railIndex struct {
	rail   *railclient.Client
	byRef  map[string][]railclient.Payment // nil: ask per reference
	orphan map[string]bool                 // client refs not yet matched to a payout
}

func (r *Reconciler) loadRail(ctx context.Context, rep *Report) (*railIndex, error) {
	ri := &railIndex{rail: r.c.Rail}
	items, err := r.c.Rail.SettlementReport(ctx)
	switch {
	case isForbidden(err):
		rep.note("the rail refused this token its settlement report; rail payments were looked up per payout, and payments carrying no known client reference were not checked (give the reconciler a token the rail accepts for /v1/settlement-report)")
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
		delete(ri.orphan, clientRef)
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

func inFlight(s pc.State) bool { return s == pc.Claimed || s == pc.RailSubmitted || s == pc.RailAcked }

func (r *Reconciler) checkPayouts(ctx context.Context, rep *Report, grants *grantIndex) error {
	// The rail is read before the proxy and paydb: a payment the rail holds
	// was preceded by its submission's intent row (and the payout's
	// RAIL_SUBMITTED), so later reads of those must show them.
	ri, err := r.loadRail(ctx, rep)
	if err != nil {
		return err
	}
	now := r.opts.Now()
	flying := map[string][]string{} // account -> payouts seen in flight
	after := ""
	for {
		page, err := r.c.Payment.Payouts(ctx, pc.PayoutFilter{After: after, Limit: r.opts.PageSize})
		if err != nil {
			return cannotRun("read the payouts", err)
		}
		for _, p := range page.Items {
			rep.Scanned.Payouts++
			after = p.ID
			if inFlight(p.State) {
				flying[p.AccountID] = append(flying[p.AccountID], p.ID)
			}
			if p.State == pc.RailAmbiguous {
				since := ambiguousSince(p)
				if age := now.Sub(since); age > r.opts.AmbiguitySLA {
					rep.add(CheckAmbiguousOverSLA, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "client_ref": p.ClientRef, "amount": p.Amount, "ambiguous_since": since.UTC(), "age_seconds": int64(age.Seconds())},
						"payout %s has been RAIL_AMBIGUOUS for %s, longer than the SLA %s: the rail has not given final evidence; an operator must decide (abandon to finance)", p.ID, age.Round(time.Second), r.opts.AmbiguitySLA)
				}
			}
			if err := r.checkClaimHistory(ctx, rep, p); err != nil {
				return err
			}
			if err := r.checkPayout(ctx, rep, p, ri, grants); err != nil {
				return err
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			break
		}
		after = page.Next
	}
	if err := r.checkInFlight(ctx, rep, flying); err != nil {
		return err
	}
	for ref := range ri.orphan {
		pays := ri.byRef[ref]
		refs := make([]string, 0, len(pays))
		for _, p := range pays {
			refs = append(refs, p.RailRef)
		}
		rep.add(CheckRailWithoutSubmission, map[string]any{"client_ref": ref, "rail_refs": refs, "payments": len(pays)},
			"the rail holds %d payment(s) with client reference %s, which belongs to no payout: money was sent around the system", len(pays), ref)
	}
	return nil
}

// ambiguousSince is when a payout's ending became unknown.
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

// checkClaimHistory: a payout's accepted changes carry non-decreasing
// tokens (INV-01): each later holder's grant is newer.
func (r *Reconciler) checkClaimHistory(ctx context.Context, rep *Report, p pc.Payout) error {
	var (
		after     int64
		prev      pc.PayoutEvent
		havePrev  bool
		reported  bool
		pageLimit = r.opts.PageSize
	)
	for {
		page, err := r.c.Payment.PayoutEvents(ctx, p.ID, after, pageLimit)
		if err != nil {
			return cannotRun("read the history of payout "+p.ID, err)
		}
		for _, ev := range page.Items {
			after = max(after, ev.ID)
			if ev.Token == 0 {
				continue
			}
			if havePrev && ev.Token < prev.Token && !reported {
				reported = true
				rep.add(CheckClaimTokenOrder, map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "key": lockKey(p.AccountID),
					"event_id": ev.ID, "token": ev.Token, "holder": string(ev.Holder), "to_state": string(ev.ToState),
					"previous_event_id": prev.ID, "previous_token": prev.Token, "previous_holder": string(prev.Holder)},
					"payout %s moved to %s under token %d after an earlier change under token %d: an older holder wrote after a newer one", p.ID, ev.ToState, ev.Token, prev.Token)
			}
			if !havePrev || ev.Token >= prev.Token {
				prev, havePrev = ev, true
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		if n, err := strconv.ParseInt(page.Next, 10, 64); err == nil && n > after {
			after = n
		}
	}
}

// payoutView is what the services say about one payout.
type payoutView struct {
	first   pc.Payout // read before the proxy and the rail
	last    pc.Payout // read after them
	subs    []proxyclient.Record
	payment []railclient.Payment
}

func (v payoutView) forwarded() []proxyclient.Record {
	var out []proxyclient.Record
	for _, s := range v.subs {
		if s.Forwarded() {
			out = append(out, s)
		}
	}
	return out
}

func (v payoutView) settled() []railclient.Payment {
	var out []railclient.Payment
	for _, p := range v.payment {
		if p.Status == railclient.StatusSettled {
			out = append(out, p)
		}
	}
	return out
}

func railRefs(ps []railclient.Payment) []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.RailRef)
	}
	return out
}

type candidate struct {
	check    string
	objects  map[string]any
	evidence string
}

// evaluate applies the cross-service rules to one view. Rules about a
// terminal state use the first read (a terminal payout no longer changes,
// and everything it implies happened before it); rules of the form "the
// proxy or rail shows X, so the payout must be past Y" use the last read.
func evaluate(v payoutView) []candidate {
	var out []candidate
	p := v.last
	add := func(check string, extra map[string]any, format string, args ...any) {
		objs := map[string]any{"payout_id": p.ID, "account_id": p.AccountID, "client_ref": p.ClientRef, "state": string(p.State)}
		for k, x := range extra {
			objs[k] = x
		}
		out = append(out, candidate{check: check, objects: objs, evidence: fmt.Sprintf(format, args...)})
	}
	fwd := v.forwarded()
	settled := v.settled()
	if len(fwd) > 1 {
		ids := make([]int64, 0, len(fwd))
		for _, s := range fwd {
			ids = append(ids, s.ID)
		}
		add(CheckForwardedSubmissions, map[string]any{"submission_ids": ids}, "payout %s has %d forwarded submissions at the proxy; at most one may ever exist", p.ID, len(fwd))
	}
	if len(settled) > 1 {
		add(CheckSettledPerClientRef, map[string]any{"rail_refs": railRefs(settled), "amount": p.Amount},
			"the rail settled %d payments for client reference %s: payout %s was paid %d times", len(settled), p.ClientRef, p.ID, len(settled))
	}
	if len(v.payment) > 0 && len(fwd) == 0 {
		add(CheckRailWithoutSubmission, map[string]any{"rail_refs": railRefs(v.payment)},
			"the rail holds %d payment(s) for payout %s but the proxy never forwarded a submission: money was sent around the proxy", len(v.payment), p.ID)
	}
	for _, s := range settled {
		if s.Amount != p.Amount || s.Currency != p.Currency {
			add(CheckAmountMismatch, map[string]any{"rail_ref": s.RailRef, "rail_amount": s.Amount, "rail_currency": s.Currency, "amount": p.Amount, "currency": p.Currency},
				"the rail settled %d %s for payout %s, which is for %d %s", s.Amount, s.Currency, p.ID, p.Amount, p.Currency)
		}
	}
	var sub *proxyclient.Record
	if len(fwd) > 0 {
		sub = &fwd[0]
	}
	acked := sub != nil && (sub.Outcome == proxyclient.OutcomeAcked || sub.Resolution == proxyclient.ResolutionSettled)
	subDesc := "no forwarded submission"
	if sub != nil {
		subDesc = fmt.Sprintf("submission %d outcome %s resolution %s", sub.ID, orNone(string(sub.Outcome)), orNone(string(sub.Resolution)))
	}

	// Terminal states, from the first read.
	switch f := v.first; f.State {
	case pc.Posted:
		if len(settled) == 0 {
			add(CheckPostedNotSettled, map[string]any{"amount": f.Amount},
				"payout %s is POSTED (its ledger shows %d paid) but the rail holds no settled payment for %s", f.ID, f.Amount, f.ClientRef)
		}
		if !acked {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is POSTED but the proxy has %s, not an acknowledged one", f.ID, subDesc)
		}
	case pc.Failed, pc.Abandoned:
		if len(settled) > 0 {
			add(CheckSettledNotPosted, map[string]any{"rail_refs": railRefs(settled), "amount": f.Amount},
				"payout %s is %s but the rail settled %d payment(s) for it: money left with no ledger entry", f.ID, f.State, len(settled))
		}
		if f.State == pc.Failed && acked {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is FAILED but the proxy has %s", f.ID, subDesc)
		}
	}
	// Causal rules, from the last read.
	switch p.State {
	case pc.Pending, pc.Claimed:
		if len(settled) > 0 {
			add(CheckSettledNotPosted, map[string]any{"rail_refs": railRefs(settled), "amount": p.Amount},
				"the rail settled payment(s) for payout %s, which is still %s", p.ID, p.State)
		}
		if sub != nil {
			add(CheckSubmissionStateMismatch, map[string]any{"submission": subDesc},
				"payout %s is %s but the proxy already has %s (RAIL_SUBMITTED must be written first, D-4)", p.ID, p.State, subDesc)
		}
	case pc.RailAmbiguous:
		if sub == nil {
			add(CheckAmbiguousNoSubmission, nil,
				"payout %s is RAIL_AMBIGUOUS but the proxy has no forwarded submission for it: nothing can be looked up; an operator must decide", p.ID)
		}
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// checkPayout runs the per-payout cross-service rules and INV-07 on the
// payout's forwarded submission.
func (r *Reconciler) checkPayout(ctx context.Context, rep *Report, p pc.Payout, ri *railIndex, grants *grantIndex) error {
	subs, err := r.c.Proxy.GetAll(ctx, p.ID)
	if err != nil && !isNotFound(err) {
		return cannotRun("read the submissions of payout "+p.ID, err)
	}
	pays, err := ri.find(ctx, p.ClientRef)
	if err != nil {
		return cannotRun("ask the rail about "+p.ClientRef, err)
	}
	view := payoutView{first: p, last: p, subs: subs, payment: pays}

	for _, s := range view.forwarded() {
		key := lockKey(s.AccountID)
		ok, other, err := grants.granted(ctx, s.FenceToken, key)
		if err != nil {
			return cannotRun("read the lock service's grant log", err)
		}
		objs := map[string]any{"payout_id": p.ID, "submission_id": s.ID, "account_id": s.AccountID, "token": s.FenceToken, "holder": string(s.Holder), "key": key}
		if ok {
			// The token was granted for this key, but to whom? A holder other
			// than the grant's session means the token was issued twice
			// (a rewound lock service) and this write rode on a grant that
			// was never its own.
			if sess := grants.sessions[s.FenceToken]; sess != "" && sess != string(s.Holder) {
				objs["granted_session"] = sess
				rep.add(CheckSubmissionWithoutGrant, objs, "submission %d of payout %s was forwarded with token %d by holder %s, but the lock service granted that token to session %s", s.ID, p.ID, s.FenceToken, s.Holder, sess)
			}
			continue
		}
		if other != "" {
			objs["granted_key"] = other
			rep.add(CheckSubmissionWithoutGrant, objs, "submission %d of payout %s was forwarded with token %d, which the lock service granted for %s, not %s", s.ID, p.ID, s.FenceToken, other, key)
		} else {
			rep.add(CheckSubmissionWithoutGrant, objs, "submission %d of payout %s was forwarded with token %d, which the lock service's grant log does not contain", s.ID, p.ID, s.FenceToken)
		}
	}

	cands := evaluate(view)
	if len(cands) == 0 {
		return nil
	}
	// Read again, fresh and in write order, before reporting anything.
	first, err := r.c.Payment.Payout(ctx, p.ID)
	if err != nil {
		return cannotRun("read payout "+p.ID, err)
	}
	pays, err = ri.fresh(ctx, p.ClientRef)
	if err != nil {
		return cannotRun("ask the rail about "+p.ClientRef, err)
	}
	subs, err = r.c.Proxy.GetAll(ctx, p.ID)
	if err != nil && !isNotFound(err) {
		return cannotRun("read the submissions of payout "+p.ID, err)
	}
	last, err := r.c.Payment.Payout(ctx, p.ID)
	if err != nil {
		return cannotRun("read payout "+p.ID, err)
	}
	for _, c := range evaluate(payoutView{first: first, last: last, subs: subs, payment: pays}) {
		rep.add(c.check, c.objects, "%s", c.evidence)
	}
	return nil
}

// checkInFlight: at most one payout per account in CLAIMED, RAIL_SUBMITTED
// or RAIL_ACKED (INV-01). Suspects are read again: a payout can finish
// and its successor start while the list is being paged.
func (r *Reconciler) checkInFlight(ctx context.Context, rep *Report, flying map[string][]string) error {
	for account, ids := range flying {
		if len(ids) < 2 {
			continue
		}
		var still []string
		states := map[string]any{}
		for _, id := range ids {
			p, err := r.c.Payment.Payout(ctx, id)
			if err != nil {
				return cannotRun("read payout "+id, err)
			}
			if inFlight(p.State) {
				still = append(still, id)
				states[id] = string(p.State)
			}
		}
		if len(still) < 2 {
			continue
		}
		rep.add(CheckInFlightPerAccount, map[string]any{"account_id": account, "key": lockKey(account), "payouts": still, "states": states},
			"account %s has %d payouts in flight at once (%v): two holders worked the account together", account, len(still), still)
	}
	return nil
}

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
			cursor = strconv.FormatInt(e.ID, 10)
		}
		if page.Next == "" || len(page.Items) == 0 {
			return nil
		}
		cursor = page.Next
	}
}
