package httpx

import (
	"context"
	"sync"
)

// Group runs components together: the first to return (error or not)
// cancels the others, and Wait returns the first error.
type Group struct {
	fns []func(ctx context.Context) error
}

// Add registers a component. It must return when its ctx is cancelled.
func (g *Group) Add(fn func(ctx context.Context) error) { g.fns = append(g.fns, fn) }

// Run starts every component and waits for all of them.
func (g *Group) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg    sync.WaitGroup
		once  sync.Once
		first error
	)
	for _, fn := range g.fns {
		wg.Add(1)
		go func(fn func(ctx context.Context) error) {
			defer wg.Done()
			err := fn(ctx)
			if err != nil {
				once.Do(func() { first = err })
			}
			cancel()
		}(fn)
	}
	wg.Wait()
	return first
}
