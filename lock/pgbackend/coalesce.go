package pgbackend

import (
	"context"
	"sync"
	"time"
)

// A coalescer runs concurrent calls of one kind (acquires of free keys,
// releases) as few statements: while `slots` statements of the kind are in
// flight, the calls that arrive queue, and the next statement takes up to
// `max` of them at once, one per key. This is group commit: under load one
// statement, one round trip and one commit (one WAL flush) serve a whole
// queue, and a call that finds a free slot runs at once, alone, so an idle
// service answers as soon as it did before.
//
// Each call keeps its own answer: a statement's outcome is decided per key,
// exactly as if the calls had run one after another in some order.
type coalescer[Req any, Res any] struct {
	slots int // statements of this kind in flight at once
	max   int // calls per statement
	key   func(Req) string
	// run executes one statement for reqs (distinct keys) and returns one
	// answer per request, in order; err fails every request of the batch.
	run func(ctx context.Context, reqs []Req) ([]Res, error)

	mu      sync.Mutex
	queue   []*call[Req, Res]
	running int
}

type call[Req any, Res any] struct {
	ctx  context.Context
	req  Req
	res  Res
	err  error
	done chan struct{}
}

// do queues req and waits for its answer, or for ctx to end.
func (c *coalescer[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	cl := &call[Req, Res]{ctx: ctx, req: req, done: make(chan struct{})}
	c.mu.Lock()
	c.queue = append(c.queue, cl)
	lead := c.running < c.slots
	if lead {
		c.running++
	}
	c.mu.Unlock()
	if lead {
		c.lead()
	}
	select {
	case <-cl.done:
		return cl.res, cl.err
	case <-ctx.Done():
		// The statement may still run and take effect, as when a single
		// statement's context ends in flight: the caller cannot know.
		var zero Res
		return zero, ctx.Err()
	}
}

// queued is how many calls wait for a statement.
func (c *coalescer[Req, Res]) queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// lead runs one statement over what is queued, then hands the slot on: to a
// new goroutine when calls are waiting, so that no caller stays behind to
// serve others once its own answer is in.
func (c *coalescer[Req, Res]) lead() {
	batch := c.take()
	if len(batch) > 0 {
		c.exec(batch)
	}
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.running--
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	go c.lead()
}

// take removes up to max calls from the queue, oldest first, at most one
// per key (a second call for a key waits for the next statement), and
// answers those whose context has already ended.
func (c *coalescer[Req, Res]) take() []*call[Req, Res] {
	c.mu.Lock()
	defer c.mu.Unlock()
	var (
		batch []*call[Req, Res]
		keys  = make(map[string]struct{}, min(len(c.queue), c.max))
		left  = c.queue[:0]
	)
	for _, cl := range c.queue {
		if err := cl.ctx.Err(); err != nil {
			cl.err = err
			close(cl.done)
			continue
		}
		k := c.key(cl.req)
		if _, dup := keys[k]; dup || len(batch) == c.max {
			left = append(left, cl)
			continue
		}
		keys[k] = struct{}{}
		batch = append(batch, cl)
	}
	clear(c.queue[len(left):])
	c.queue = left
	return batch
}

// exec runs one statement for batch, under the latest of its callers'
// deadlines (none if one of them has none): a caller that gives up does
// not cancel the others' statement.
func (c *coalescer[Req, Res]) exec(batch []*call[Req, Res]) {
	reqs := make([]Req, len(batch))
	var (
		latest   time.Time
		deadline = true
	)
	for i, cl := range batch {
		reqs[i] = cl.req
		d, ok := cl.ctx.Deadline()
		deadline = deadline && ok
		if d.After(latest) {
			latest = d
		}
	}
	ctx := context.WithoutCancel(batch[0].ctx)
	if deadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	res, err := c.run(ctx, reqs)
	for i, cl := range batch {
		if err != nil {
			cl.err = err
		} else {
			cl.res = res[i]
		}
		close(cl.done)
	}
}

const (
	// coalesceSlots is how many statements of one kind run at once.
	coalesceSlots = 1
	// coalesceMax is how many calls one statement carries at most.
	coalesceMax = 64
)
