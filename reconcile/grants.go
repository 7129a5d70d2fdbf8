package reconcile

import (
	"context"

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
