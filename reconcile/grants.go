package reconcile

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/payouts/payouts/lock/fencing"
)

// ---- the grant log (INV-07) ----

// grantIndex is the grant log as token -> (key, session). It is the one
// structure that grows with the history, so it is kept compact: the
// tokens read in order in one sorted slice, beside the key and session of
// each as indexes into one table of their distinct strings (a log holds
// far fewer keys and sessions than grants): 16 bytes a grant, where maps
// of strings took about 120. A grant found on its own, out of token order,
// is kept in a map.
type grantIndex struct {
	svc   LockService
	limit int
	// tokens ascending; keys[i] and sessions[i] are token[i]'s, as
	// indexes into names.
	tokens         []fencing.Token
	keys, sessions []uint32
	names          []string
	nameIdx        map[string]uint32
	// late are grants looked up on their own (below last when found).
	late map[fencing.Token][2]uint32
	last fencing.Token
	// horizon: a write made before it may have outlived its grant's
	// record (compacted by the lock service's retention); zero: none.
	horizon time.Time
	// margin is the clock-skew allowance the horizon was set with.
	margin time.Duration
	// beyond counts the writes not checked for that reason, by kind.
	beyond map[string]int
	// lostThrough: the grants of tokens at or below it may have been lost
	// by a restore of the lock service (Options.GrantLogLostThrough); lost
	// counts the writes not checked for that reason, by kind.
	lostThrough fencing.Token
	lost        map[string]int
	// mu serialises lookups: payouts are checked concurrently.
	mu sync.Mutex
}

// GrantClockSkew is the margin the retention window allows between the
// clocks of the lock service and of the databases that date the writes: a
// write dated within it of the retention's edge is not checked. A retention
// shorter than twice the margin gets half of itself as margin instead, so
// that the newer half of its window is still checked: with a margin as long
// as the retention, no write would ever be.
const GrantClockSkew = time.Hour

// withRetention sets the horizon for a lock service that compacts ended
// grants after retention (0: never), seen at now.
func (g *grantIndex) withRetention(retention time.Duration, now time.Time) *grantIndex {
	if retention > 0 {
		g.margin = min(GrantClockSkew, retention/2)
		g.horizon = now.Add(-retention + g.margin)
	}
	return g
}

// withLoss sets the token at or below which the grant log may have lost
// grants to a restore (0: none).
func (g *grantIndex) withLoss(through fencing.Token) *grantIndex {
	g.lostThrough = through
	return g
}

// lostGrant reports whether a write of kind under token may have lost its
// grant to a restore of the lock service, and counts it if so.
func (g *grantIndex) lostGrant(token fencing.Token, kind string) bool {
	if token > g.lostThrough {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lost[kind]++
	return true
}

// beyondRetention reports whether a write of kind made at `at` is older
// than the grant log's retention, and counts it if so. Its grant ended
// after it was written, so a grant the lock service may have compacted
// (ended before now less the retention) belongs to a write older than that.
func (g *grantIndex) beyondRetention(at time.Time, kind string) bool {
	if g.horizon.IsZero() || !at.Before(g.horizon) {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.beyond[kind]++
	return true
}

// noteBeyond notes on rep how many writes the retention, or a restore's
// loss, kept from the check.
func (g *grantIndex) noteBeyond(rep *Report) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if n := g.lost["ledger"] + g.lost["submission"]; n > 0 {
		rep.note("%d ledger entries and %d submissions under tokens at or below %d (--grant-log-lost-through: grants a restore of the lock service lost) were not checked against the grant log",
			g.lost["ledger"], g.lost["submission"], g.lostThrough)
	}
	if n := g.beyond["ledger"] + g.beyond["submission"]; n > 0 {
		rep.note("%d ledger entries and %d submissions written before %s (the grant retention, less %s for clock skew) were not checked against the grant log: their grants may have been compacted",
			g.beyond["ledger"], g.beyond["submission"], g.horizon.UTC().Format(time.RFC3339), g.margin)
	}
}

func newGrantIndex(svc LockService, limit int) *grantIndex {
	return &grantIndex{svc: svc, limit: limit, nameIdx: map[string]uint32{}, late: map[fencing.Token][2]uint32{}, beyond: map[string]int{}, lost: map[string]int{}}
}

// name is s's index in names, added when new.
func (g *grantIndex) name(s string) uint32 {
	if i, ok := g.nameIdx[s]; ok {
		return i
	}
	i := uint32(len(g.names))
	g.names = append(g.names, s)
	g.nameIdx[s] = i
	return i
}

// len is how many grants the index holds.
func (g *grantIndex) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.tokens) + len(g.late)
}

// add adds a grant read in token order (above last); one below it (a grant
// found out of order) goes with those found on their own.
func (g *grantIndex) add(token fencing.Token, key, session string) {
	if token <= g.last {
		g.late[token] = [2]uint32{g.name(key), g.name(session)}
		return
	}
	g.tokens = append(g.tokens, token)
	g.keys, g.sessions = append(g.keys, g.name(key)), append(g.sessions, g.name(session))
	g.last = token
}

// load reads the grant log from where it stopped last time.
func (g *grantIndex) load(ctx context.Context) error {
	for {
		items, next, err := g.svc.Grants(ctx, g.last, g.limit)
		if err != nil {
			return err
		}
		for _, it := range items {
			g.add(it.Token, it.Key, it.SessionID)
		}
		if next == 0 || len(items) == 0 {
			return nil
		}
		g.last = max(g.last, next)
	}
}

// find is token's key and session.
func (g *grantIndex) find(token fencing.Token) (key, session string, ok bool) {
	if i, found := slices.BinarySearch(g.tokens, token); found {
		return g.names[g.keys[i]], g.names[g.sessions[i]], true
	}
	if e, found := g.late[token]; found {
		return g.names[e[0]], g.names[e[1]], true
	}
	return "", "", false
}

// granted reports whether the lock service granted token for key.
//
// The index is read in token order, but the lock service's store commits
// grants of different keys out of token order (PostgreSQL: a sequence
// value is taken before the transaction commits), so a page can be read
// before a lower token's grant is visible. The row being checked was read
// before this call and was written under its grant, so the grant has
// committed by now: a token the index lacks is looked up on its own before
// anything is reported.
func (g *grantIndex) granted(ctx context.Context, token fencing.Token, key string) (bool, string, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if k, _, ok := g.find(token); ok {
		return k == key, k, nil
	}
	if token > g.last {
		if err := g.load(ctx); err != nil {
			return false, "", err
		}
		if k, _, ok := g.find(token); ok {
			return k == key, k, nil
		}
	}
	if token <= 0 {
		return false, "", nil
	}
	items, _, err := g.svc.Grants(ctx, token-1, 1)
	if err != nil {
		return false, "", err
	}
	if len(items) == 0 || items[0].Token != token {
		return false, "", nil
	}
	// Kept apart from the log read in order: last still says how far that
	// read has come.
	g.late[token] = [2]uint32{g.name(items[0].Key), g.name(items[0].SessionID)}
	return items[0].Key == key, items[0].Key, nil
}

// session is the session token was granted to ("" when unknown).
func (g *grantIndex) session(token fencing.Token) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, s, _ := g.find(token)
	return s
}
