package executor

import (
	"log/slog"
	"time"
)

// Lingering: a grant whose round moved payouts and left its account with
// nothing more to do is kept for up to Config.GrantLinger instead of being
// released. When GET /v1/work lists the account again meanwhile, its next
// round runs under the kept grant — the same key, token and holder the
// lock service would hand this session again — without an acquire and a
// release at the lock service. Nothing changes for the guards: every write
// still presents the token and is fenced like any other.
//
// A kept grant is in kept, out of every worker's hands. It leaves it in
// one of three ways, each under e.mu:
//   - takeKept: the worker that reserved the account takes it (or finds it
//     no longer valid and queues it for release, or past its end and
//     releases it itself);
//   - expireKept: its linger passed, or the session is in jeopardy: it is
//     queued in unreleased, which the release passes (startReleases, in the
//     background) work through;
//   - keep, past the cap: the oldest is queued in unreleased likewise.
//
// Queuing in unreleased keeps the rule retryReleases enforces: a release
// never runs for an account a worker is on (that worker may hold the same
// key under the same token), and no worker starts while it runs. The one
// exception is a worker's own release of the kept grant it found past its
// end (takeKept), made before it acquires anything.

// keptGrant is a grant kept for its account's next round.
type keptGrant struct {
	g     grant
	since time.Time // kept at: its linger counts from here
	// acquired is when the grant was taken from the lock service. Rounds
	// under it end keptGrantAge after that however busy the account is,
	// so that whatever else waits for the account (the reconciler, an
	// operator's cancel) gets it.
	acquired time.Time
}

// keptGrantAge is how long after its acquire a grant may still be kept
// for another round: twice the linger, which with the default 10 s
// leaves a waiter of `payouts payout cancel` (30 s) or the reconciler
// (--lock-wait, 30 s) the account after at most 20 s, one round and one
// poll.
func (e *Executor) keptGrantAge() time.Duration { return 2 * e.cfg.GrantLinger }

// end is when k is released if no round takes it first: its linger's end,
// or keptGrantAge after its acquire if that is sooner.
func (e *Executor) end(k keptGrant) time.Time {
	end := k.since.Add(e.cfg.GrantLinger)
	if last := k.acquired.Add(e.keptGrantAge()); last.Before(end) {
		return last
	}
	return end
}

// maxKeptGrants caps the kept grants (Executor.keptCap). It is sized for
// work spread thin over many accounts, not for the workers: at 350
// payouts/s over 1,000 accounts each account gets a payout every ~3 s, and
// a cap of a few rounds' worth (it was 4 × concurrency) released nearly
// every grant before its account's next payout, so nearly every payout
// paid an acquire and a release. A kept grant costs the lock service one
// key on the session's lease and nothing per keepalive; it holds its
// account against other holders for at most the linger. One poll of
// GET /v1/work lists at most maxWorkLimit accounts, so more kept grants
// than that could not all be listed again in time to be used.
const maxKeptGrants = maxWorkLimit

// takeKept hands the account's kept grant to the worker that reserved the
// account at now; k.g is nil when none is kept, or when the kept one is no
// longer valid (the session is in jeopardy or lost: it is queued for
// release and never used) or past its end (a poll has not released it
// yet). That last one is returned as ended, for the worker to release
// before it acquires the key as for any account, as a round that ends past
// keptGrantAge releases its grant. That worker's own release is the one
// release that runs for an account a worker is on: the worker holds no
// other grant of the key until the release has settled.
func (e *Executor) takeKept(account string, now time.Time) (k keptGrant, ended grant) {
	e.mu.Lock()
	defer e.mu.Unlock()
	k, ok := e.kept[account]
	if !ok {
		return keptGrant{}, nil
	}
	delete(e.kept, account)
	e.m.keptGrants.Set(float64(len(e.kept)))
	switch {
	case !k.g.Valid():
		e.unreleased[account] = toRelease{g: k.g}
		return keptGrant{}, nil
	case !now.Before(e.end(k)):
		return keptGrant{}, k.g
	}
	return k, nil
}

// keep parks k.g, the grant of a round that left account with nothing
// more to do, for the account's next round, its linger counted from
// k.since. It reports false when the grant is not to be kept (lingering
// off, a stop requested, the grant no longer valid, or keptGrantAge past
// its acquire): the caller releases it. The caller is the account's
// worker, so the account is reserved until it has returned. Beyond the cap
// the oldest kept grant is queued for release, which the poll loop's next
// pass starts (a round that moved payouts wakes it at once).
func (e *Executor) keep(account string, k keptGrant) bool {
	if e.cfg.GrantLinger <= 0 || e.stopRequested() || !k.g.Valid() || !k.since.Before(e.end(k)) {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.kept[account] = k
	if end := e.end(k); e.keptDue.IsZero() || end.Before(e.keptDue) {
		e.keptDue = end
	}
	for len(e.kept) > e.keptCap {
		oldest := ""
		for a, k := range e.kept {
			// An account reserved by a worker (this one's included) is
			// about to be taken: leave it.
			if !e.active[a] && (oldest == "" || k.since.Before(e.kept[oldest].since)) {
				oldest = a
			}
		}
		if oldest == "" {
			break
		}
		e.unreleased[oldest] = toRelease{g: e.kept[oldest].g}
		delete(e.kept, oldest)
	}
	e.m.keptGrants.Set(float64(len(e.kept)))
	return true
}

// expireKept queues for release the kept grants whose end has passed,
// or every kept grant when all is set (the session is in jeopardy: a kept
// grant is never used after that). It returns when the next linger ends
// (zero when nothing else is kept). A grant whose account a worker has
// just reserved is left to that worker, which checks it before use.
func (e *Executor) expireKept(now time.Time, all bool) (next time.Time) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.kept) == 0 {
		return time.Time{}
	}
	if !all && !e.keptDue.IsZero() && now.Before(e.keptDue) {
		// Nothing ends before keptDue: the poll loop runs this after every
		// dispatch, so a walk of every kept grant each time costs more than
		// all the rest of a pass.
		return e.keptDue
	}
	defer func() { e.keptDue = next }()
	for a, k := range e.kept {
		end := e.end(k)
		switch {
		case e.active[a]:
			// Left to the account's worker: one that has just reserved
			// the account takes the grant (takeKept), one that has just
			// kept it is leaving the account. Its end still counts for
			// the next walk, which finds the account left or the grant
			// taken; one already past comes back keptRecheck later, not
			// at once, so the loop does not spin while a worker has it.
			end = later(end, now.Add(keptRecheck))
		case all || !now.Before(end):
			e.unreleased[a] = toRelease{g: k.g}
			delete(e.kept, a)
			continue
		}
		if next.IsZero() || end.Before(next) {
			next = end
		}
	}
	e.m.keptGrants.Set(float64(len(e.kept)))
	return next
}

// keptRecheck is how soon a walk that found a kept grant past its end,
// its account held by a worker, looks again.
const keptRecheck = 10 * time.Millisecond

// later is the later of a and b.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// dropKept forgets every kept grant and failed release when the session
// ends: closing it (or its loss) ends every grant it held. Releases still
// queued are said to be dropped, so that the WARN lines of the releases
// that failed are not left without an end: once the session is lost they
// can never be sent, and those keys stay held until the session's TTL ends
// at the lock service; otherwise the session's close releases them.
func (e *Executor) dropKept(log *slog.Logger, lost bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if n := len(e.unreleased); n > 0 {
		if lost {
			log.Info("lock session lost: dropping the queued lock releases; those locks end with the session's TTL", "keys", n)
		} else {
			log.Debug("queued lock releases left to the session's close", "keys", n)
		}
	}
	clear(e.unreleased)
	clear(e.kept)
	e.keptDue = time.Time{}
	e.m.keptGrants.Set(0)
}
