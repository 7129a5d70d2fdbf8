package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Background work: the watch on the lock prefix and the periodic sweep.

// DefaultStepTimeout bounds each step of Run (Config.StepTimeout): a
// sweep, a compaction pass, the recording of one watch answer, starting
// the watch. A member that stops answering with its connection still up
// (a frozen process, a stalled disk) would otherwise hold a step, and all
// the background work behind it, until it answers again: no expiry
// recorded (D-9), no sweep, no compaction. A step that times out is logged
// and made again at its next turn; what it wrote stays written (a
// compaction pass deletes as it reads, so each pass gets further).
const DefaultStepTimeout = 30 * time.Second

// errStepTimeout is why a step's context ended at its deadline.
var errStepTimeout = errors.New("step timed out")

// step is the context of one step of background work: it ends at the
// step timeout, or with ctx.
func (b *Backend) step(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, b.stepTimeout, errStepTimeout)
}

// inStep runs fn in a step of its own.
func (b *Backend) inStep(ctx context.Context, fn func(context.Context)) {
	sctx, cancel := b.step(ctx)
	defer cancel()
	fn(sctx)
}

// stopping reports whether ctx ended because the work it bounds is being
// stopped (Run's context ended), not at a step's timeout: a failure is
// then no news.
func stopping(ctx context.Context) bool {
	return ctx.Err() != nil && !errors.Is(context.Cause(ctx), errStepTimeout)
}

// failure is err as a warning tells it: saying so when the step timed out.
func (b *Backend) failure(ctx context.Context, err error) string {
	if errors.Is(context.Cause(ctx), errStepTimeout) {
		return fmt.Sprintf("%v (no answer within %s)", err, b.stepTimeout)
	}
	return err.Error()
}

func (b *Backend) startWatch(ctx context.Context) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(context.Background()))
	ch := b.cli.Watch(wctx, b.prefix+"/locks/", clientv3.WithPrefix(), clientv3.WithPrevKV(),
		clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
	select {
	case resp, ok := <-ch:
		if !ok || resp.Err() != nil || !resp.Created {
			cancel()
			if ok && resp.Err() != nil {
				return resp.Err()
			}
			return errors.New("watch was not created")
		}
	case <-ctx.Done():
		cancel()
		return ctx.Err()
	}
	b.mu.Lock()
	if b.watchCancel != nil {
		b.watchCancel()
	}
	b.watchCancel, b.watchCh = cancel, ch
	b.mu.Unlock()
	return nil
}

// Run implements backend.Backend: records grants ended by lease expiry (from
// the watch, and by a periodic sweep for anything the watch missed, e.g.
// while no lock service was running).
func (b *Backend) Run(ctx context.Context) error {
	t := time.NewTicker(b.sweepIv)
	defer t.Stop()
	compact := time.NewTicker(b.cfg.CompactInterval)
	defer compact.Stop()
	// The store's size is asked beside the loop, one report at a time.
	var sizing sync.WaitGroup
	defer sizing.Wait()
	var reporting atomic.Bool
	reportSize := func() {
		if reporting.CompareAndSwap(false, true) {
			sizing.Go(func() { defer reporting.Store(false); b.reportSize(ctx) })
		}
	}
	var following sync.WaitGroup
	defer following.Wait()
	following.Go(func() { b.followWaiting(ctx, b.waitingRev) })
	// Each step has a deadline of its own (step): Run's context may have
	// none, and a member that does not answer must not hold Run.
	b.inStep(ctx, b.sweep)
	reportSize()
	for ctx.Err() == nil {
		b.mu.Lock()
		ch := b.watchCh
		b.mu.Unlock()
		if ch == nil {
			sctx, cancel := b.step(ctx)
			err := b.startWatch(sctx)
			cancel()
			if err != nil {
				if ctx.Err() == nil {
					b.log.Warn("etcd watch failed; retrying", "error", b.failure(sctx, err))
				}
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
				continue
			}
			b.inStep(ctx, b.sweep) // catch what happened while not watching
			continue
		}
		select {
		case <-ctx.Done():
		case <-t.C:
			b.inStep(ctx, b.sweep)
		case <-compact.C:
			b.inStep(ctx, b.compactNow)
			reportSize()
		case resp, ok := <-ch:
			if !ok || resp.Err() != nil || resp.Canceled {
				b.mu.Lock()
				if b.watchCancel != nil {
					b.watchCancel()
				}
				b.watchCh, b.watchCancel = nil, nil
				b.mu.Unlock()
				continue
			}
			b.inStep(ctx, func(ctx context.Context) { b.recordDeletions(ctx, resp.Events) })
		}
	}
	return nil
}
