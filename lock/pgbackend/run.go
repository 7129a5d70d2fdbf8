package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/obs"
)

// Background work: the reaper, failover detection (D-12) and the LISTEN
// loop that wakes waiting acquires.

// Changed implements backend.Backend: signalled by LISTEN/NOTIFY (Run).
func (b *Backend) Changed(key string) (<-chan struct{}, func()) { return b.waiters.Changed(key) }

func (b *Backend) signal(key string) { b.waiters.Signal(key) }

// Waiting implements backend.Backend. Nothing is written: a waiting
// acquire that finds the key held marks the grant contended
// (markContended), and its end reports Waited from that mark, even if the
// waiter has given up since.
func (b *Backend) Waiting(ctx context.Context, key, sessionID string, until time.Time) func() {
	return func() {}
}

// Run implements backend.Backend: the reaper, failover detection and the
// LISTEN loop, until ctx ends.
func (b *Backend) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); b.listen(ctx) }()
	go func() { defer wg.Done(); b.reapLoop(ctx) }()
	go func() { defer wg.Done(); b.compactLoop(ctx) }()
	wg.Wait()
	return nil
}

func (b *Backend) reapLoop(ctx context.Context) {
	t := time.NewTicker(b.cfg.ReapInterval)
	defer t.Stop()
	// The loop runs every ReapInterval (250 ms): while lockdb is down each
	// tick fails, and a line per tick would bury the rest of the log.
	unreachable := obs.NewOutage(b.log)
	reapFailing := obs.NewOutage(b.log)
	for {
		if err := b.checkEpoch(ctx, false); err == nil {
			unreachable.Recover(ctx, "lock store reachable again")
			if err := b.Reap(ctx); err != nil && ctx.Err() == nil {
				reapFailing.Fail(ctx, "lock reaper failed; will retry", err)
			} else if err == nil {
				reapFailing.Recover(ctx, "lock reaper works again")
			}
		} else if ctx.Err() == nil {
			unreachable.Fail(ctx, "lock store unreachable; will retry", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// checkEpoch starts a grace period (D-12) when this process starts (force)
// or when the database's identity changed since any lock service last
// looked: failover, restore or crash restart. The grace lasts the longest
// TTL of any active session, so every client gets one full TTL to renew.
func (b *Backend) checkEpoch(ctx context.Context, force bool) error {
	var (
		until    time.Time
		identity string
		prev     string
	)
	err := b.pool.QueryRow(ctx, `
		WITH old AS (SELECT identity FROM lock_epoch)
		UPDATE lock_epoch
		   SET identity = lock_db_identity(),
		       grace_until = greatest(grace_until, now() + coalesce(
		           (SELECT max(ttl_ms) FROM lock_session WHERE state = 'ACTIVE'), 0) * interval '1 millisecond'),
		       updated_at = now()
		 WHERE $1 OR identity IS DISTINCT FROM lock_db_identity()
		RETURNING grace_until, identity, (SELECT identity FROM old)`, force).Scan(&until, &identity, &prev)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil
	}
	if err != nil {
		return b.classify("check database identity", err)
	}
	why := "lock service started"
	if prev != identity && prev != "" {
		why = fmt.Sprintf("database identity changed from %s to %s (failover, restore or restart)", prev, identity)
	}
	b.log.Warn("lock grace period: no session expires until it ends", "grace_until", until.UTC(), "reason", why)
	b.graceStarted(until, why)
	return nil
}

// listen holds one connection in LISTEN and wakes local waiters, reconnecting
// after failures. While it is down, waiters fall back to their timer.
func (b *Backend) listen(ctx context.Context) {
	// Reconnected every 500 ms while lockdb is down: logged once per
	// outage (and a reminder now and then), not per attempt.
	lost := obs.NewOutage(b.log)
	for ctx.Err() == nil {
		err := b.listenOnce(ctx, lost)
		if ctx.Err() != nil {
			return
		}
		lost.Fail(ctx, "lock notification listener lost its connection; reconnecting", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (b *Backend) startListening(ctx context.Context) (*pgx.Conn, error) {
	pc, err := b.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	// The connection stays in LISTEN state: never return it to the pool.
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, `LISTEN `+notifyChannel); err != nil {
		conn.Close(context.Background())
		return nil, err
	}
	return conn, nil
}

// listenOnce listens until its connection fails; lost learns when it
// listens again after an outage.
func (b *Backend) listenOnce(ctx context.Context, lost *obs.Outage) error {
	b.mu.Lock()
	conn := b.listener
	b.listener = nil
	b.mu.Unlock()
	if conn == nil {
		var err error
		if conn, err = b.startListening(ctx); err != nil {
			return err
		}
	}
	lost.Recover(ctx, "lock notification listener listening again")
	defer conn.Close(context.Background())
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		b.signal(n.Payload)
	}
}

// compactLoop runs Compact every CompactInterval while there is a retention.
func (b *Backend) compactLoop(ctx context.Context) {
	if b.cfg.GrantRetention <= 0 {
		return
	}
	t := time.NewTicker(b.cfg.CompactInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		g, s, err := b.Compact(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			b.log.Warn("grant log compaction failed; will retry", "error", err.Error())
		case g+s > 0:
			b.log.Info("grant log compacted", "grants", g, "sessions", s, "retention", b.cfg.GrantRetention.String())
		}
	}
}
