package reconcile

import (
	"context"
	"sync"

	"github.com/payouts/payouts/lock/fencing"
)

// ---- the grant log (INV-07) ----

type grantIndex struct {
	svc   LockService
	limit int
	keys  map[fencing.Token]string
	// sessions is the session each token was granted to.
	sessions map[fencing.Token]string
	last     fencing.Token
	// mu serialises lookups: payouts are checked concurrently.
	mu sync.Mutex
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
	g.keys[token] = items[0].Key
	g.sessions[token] = items[0].SessionID
	return items[0].Key == key, items[0].Key, nil
}

// session is the session token was granted to ("" when unknown).
func (g *grantIndex) session(token fencing.Token) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.sessions[token]
}
