package etcdbackend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Background work: the watch on the lock prefix and the periodic sweep.

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
	b.sweep(ctx)
	reportSize()
	for ctx.Err() == nil {
		b.mu.Lock()
		ch := b.watchCh
		b.mu.Unlock()
		if ch == nil {
			if err := b.startWatch(ctx); err != nil {
				if ctx.Err() == nil {
					b.log.Warn("etcd watch failed; retrying", "error", err.Error())
				}
				select {
				case <-ctx.Done():
				case <-time.After(500 * time.Millisecond):
				}
				continue
			}
			b.sweep(ctx) // catch what happened while not watching
			continue
		}
		select {
		case <-ctx.Done():
		case <-t.C:
			b.sweep(ctx)
		case <-compact.C:
			b.compactNow(ctx)
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
			b.recordDeletions(ctx, resp.Events)
		}
	}
	return nil
}
