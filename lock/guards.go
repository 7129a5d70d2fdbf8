package lock

import (
	"context"
	"errors"
	"fmt"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/lock/fencing"
)

// Guard is one guard (the payment resource or the rail proxy) whose highest
// stored fence bounds the tokens the lock service may issue next.
type Guard struct {
	Name  string // "payment" or "proxy", for messages
	URL   string
	Token string // a bearer token the guard accepts for GET /v1/fences/high
}

// GuardFence is a guard's answer to GET /v1/fences/high.
type GuardFence struct {
	Guard string        `json:"guard"`
	URL   string        `json:"url"`
	Token fencing.Token `json:"token"`
}

// GuardsHighFence reads every guard's highest stored fence. It fails unless
// every guard answers: a bump computed from one guard alone could stay
// below the other's fence.
func GuardsHighFence(ctx context.Context, guards []Guard, opts ...httpx.ClientOption) ([]GuardFence, error) {
	if len(guards) == 0 {
		return nil, errors.New("no guard to read the highest fence from")
	}
	out := make([]GuardFence, 0, len(guards))
	for _, g := range guards {
		if g.URL == "" {
			return nil, fmt.Errorf("the %s guard's URL is required", g.Name)
		}
		c, err := httpx.NewClient(g.URL, g.Token, opts...)
		if err != nil {
			return nil, fmt.Errorf("%s guard: %w", g.Name, err)
		}
		var r struct {
			Token fencing.Token `json:"token"`
		}
		if err := c.Get(ctx, "/v1/fences/high", nil, &r); err != nil {
			return nil, fmt.Errorf("read the %s guard's highest fence at %s: %w", g.Name, g.URL, err)
		}
		if r.Token < 0 || (r.Token != 0 && !r.Token.Valid()) {
			return nil, fmt.Errorf("the %s guard at %s answered an invalid highest fence %d", g.Name, g.URL, int64(r.Token))
		}
		out = append(out, GuardFence{Guard: g.Name, URL: g.URL, Token: r.Token})
	}
	return out, nil
}

// BumpTarget is the token every future grant must exceed after a restore or
// a promoted replica (D-13): the highest fence any guard stores, plus margin.
func BumpTarget(fences []GuardFence, margin int64) (fencing.Token, error) {
	var high fencing.Token
	for _, f := range fences {
		high = max(high, f.Token)
	}
	to := fencing.Token(int64(high) + margin)
	if margin < 0 || !to.Valid() {
		return 0, fmt.Errorf("highest fence %d plus margin %d is not a valid token (1 .. 2^53-1)", int64(high), margin)
	}
	return to, nil
}
