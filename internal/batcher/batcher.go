// Package batcher coalesces concurrent requests into batches, as a
// database's group commit does: a request that arrives while a batch is
// being written waits and goes out with the others that arrived meanwhile,
// in one statement and one transaction; a request that arrives when
// nothing is being written goes out at once, alone. Nothing waits on a
// timer.
package batcher

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"
)

// Func writes one batch: it answers one result per request, in order, or
// an error that fails every request of the batch.
type Func[Req, Res any] func(ctx context.Context, reqs []Req) ([]Res, error)

// Options bound a Batcher.
type Options struct {
	// MaxBatch is the most requests in one batch (default 256).
	MaxBatch int
	// Parallel is how many batches may be written at once (default 1).
	Parallel int
	// Timeout bounds each batch's write (default 30s). A batch runs
	// detached from its callers' contexts: one caller going away does not
	// fail the others.
	Timeout time.Duration
	// Observe, if set, is told the size of every batch written.
	Observe func(size int)
	// DropAbandoned: a request whose caller's context ends before a batch
	// has taken it is not written (a lock release its caller was told
	// failed, and may try again). Otherwise it is written with the next
	// batch all the same (a rail's answer to record whoever waits for it).
	DropAbandoned bool
}

// Batcher batches the requests of Do and writes them with its Func.
type Batcher[Req, Res any] struct {
	write Func[Req, Res]
	opts  Options

	mu      sync.Mutex
	waiting []*call[Req, Res]
	writing int // batches being written (at most opts.Parallel)
	// idle is signalled (under mu) when writing falls to 0. Not a
	// WaitGroup: Wait may run while a call starts a writer (a server's
	// shutdown while a handler still writes), and a WaitGroup's Add from
	// zero concurrent with its Wait is a misuse that may panic.
	idle *sync.Cond
}

type call[Req, Res any] struct {
	req  Req
	res  Res
	err  error
	done chan struct{}
}

// New returns a Batcher that writes batches with write.
func New[Req, Res any](write Func[Req, Res], opts Options) *Batcher[Req, Res] {
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = 256
	}
	if opts.Parallel <= 0 {
		opts.Parallel = 1
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 30 * time.Second
	}
	b := &Batcher[Req, Res]{write: write, opts: opts}
	b.idle = sync.NewCond(&b.mu)
	return b
}

// ErrShortAnswer is a batch's error when its Func answered a different
// number of results than it was given requests.
var ErrShortAnswer = errors.New("batcher: the batch's answer does not have one result per request")

// Do queues req for the next batch and returns its result. If ctx ends
// first, Do returns ctx's error; the request may still be written, unless
// DropAbandoned is set and no batch has taken it yet.
func (b *Batcher[Req, Res]) Do(ctx context.Context, req Req) (Res, error) {
	c := &call[Req, Res]{req: req, done: make(chan struct{})}
	b.mu.Lock()
	b.waiting = append(b.waiting, c)
	start := b.writing < b.opts.Parallel
	if start {
		b.writing++
	}
	b.mu.Unlock()
	if start {
		go b.drain(context.WithoutCancel(ctx))
	}
	select {
	case <-c.done:
		return c.res, c.err
	case <-ctx.Done():
		if b.opts.DropAbandoned {
			b.mu.Lock()
			for i, w := range b.waiting {
				if w == c {
					b.waiting = append(b.waiting[:i], b.waiting[i+1:]...)
					break
				}
			}
			b.mu.Unlock()
		}
		var zero Res
		return zero, ctx.Err()
	}
}

// Waiting is how many requests wait for a batch.
func (b *Batcher[Req, Res]) Waiting() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.waiting)
}

// Writing is how many batches are being written.
func (b *Batcher[Req, Res]) Writing() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.writing
}

// Distinct splits the indexes 0..n-1 into rounds whose keys are distinct,
// in order: a key's first index goes in the first round, its second in the
// second, and so on. A Func whose statement needs distinct keys writes the
// rounds one after another, so a repeated request finds the first written.
func Distinct[K comparable](n int, key func(i int) K) [][]int {
	var rounds [][]int
	seen := make(map[K]int, n) // how many times each key has come
	for i := range n {
		k := key(i)
		r := seen[k]
		seen[k] = r + 1
		if r == len(rounds) {
			rounds = append(rounds, nil)
		}
		rounds[r] = append(rounds[r], i)
	}
	return rounds
}

// InRounds answers a batch of reqs by running one write (run) for each
// round of requests with distinct keys (Distinct: a repeated key goes in
// the round after, and finds the first one's effect), in order. A round
// whose write fails gives its error (failed) to its requests and to those
// of the rounds after it, which do not run; the rounds before it have
// taken effect and keep their answers.
func InRounds[Req, Res any, K comparable](reqs []Req, key func(Req) K, failed func(error) Res, run func(round []Req) ([]Res, error)) []Res {
	out := make([]Res, len(reqs))
	var err error
	for _, round := range Distinct(len(reqs), func(i int) K { return key(reqs[i]) }) {
		if err == nil {
			sub := make([]Req, len(round))
			for j, i := range round {
				sub[j] = reqs[i]
			}
			var res []Res
			if res, err = run(sub); err == nil && len(res) != len(sub) {
				err = ErrShortAnswer
			}
			if err == nil {
				for j, i := range round {
					out[i] = res[j]
				}
				continue
			}
		}
		for _, i := range round {
			out[i] = failed(err)
		}
	}
	return out
}

// Wait returns when no batch is being written. Requests queued meanwhile
// are written before it returns.
func (b *Batcher[Req, Res]) Wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.writing > 0 {
		b.idle.Wait()
	}
}

// drain writes batches until nothing waits.
func (b *Batcher[Req, Res]) drain(ctx context.Context) {
	for {
		b.mu.Lock()
		n := min(len(b.waiting), b.opts.MaxBatch)
		if n == 0 {
			b.writing--
			if b.writing == 0 {
				b.idle.Broadcast()
			}
			b.mu.Unlock()
			return
		}
		batch := make([]*call[Req, Res], n)
		copy(batch, b.waiting)
		b.waiting = append(b.waiting[:0], b.waiting[n:]...)
		b.mu.Unlock()
		b.run(ctx, batch)
	}
}

func (b *Batcher[Req, Res]) run(ctx context.Context, batch []*call[Req, Res]) {
	if b.opts.Observe != nil {
		b.opts.Observe(len(batch))
	}
	reqs := make([]Req, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	res, err := b.call(ctx, reqs)
	if err == nil && len(res) != len(batch) {
		err = ErrShortAnswer
	}
	for i, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res = res[i]
		}
		close(c.done)
	}
}

// call runs the Func on reqs. A panic in it is the batch's error: it runs
// in a goroutine of its own, where no request's recovery reaches, so
// unrecovered it would end the process and every request in flight.
func (b *Batcher[Req, Res]) call(ctx context.Context, reqs []Req) (res []Res, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.Timeout)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return b.write(ctx, reqs)
}

// ErrPanic is a batch's error when its Func panicked.
var ErrPanic = errors.New("batcher: the batch's write panicked")
