package pgbackend

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

// Sessions: a client's liveness relationship, one lock_session row.

const sessionCols = `id, owner, principal, ttl_ms, state, created_at, last_heartbeat_at, expires_at,
	lock_session_live(state, expires_at) AS live, now() AS db_now`

func scanSession(row pgx.Row) (backend.Session, error) {
	var (
		s     backend.Session
		ttlMS int64
		live  bool
		now   time.Time
	)
	if err := row.Scan(&s.ID, &s.Owner, &s.Principal, &ttlMS, &s.State, &s.CreatedAt, &s.LastHeartbeatAt, &s.ExpiresAt, &live, &now); err != nil {
		return s, err
	}
	s.TTL = time.Duration(ttlMS) * time.Millisecond
	switch {
	case s.State == backend.StateActive && !live:
		// Lapsed; the reaper will record it shortly. It is expired now.
		s.State = backend.StateExpired
	case s.State == backend.StateActive:
		s.State = backend.SessionState(s.LastHeartbeatAt, now, s.TTL)
	}
	return s, nil
}

// CreateSession implements backend.Backend.
func (b *Backend) CreateSession(ctx context.Context, owner, principal string, ttl time.Duration) (backend.Session, error) {
	row := b.pool.QueryRow(ctx, `
		INSERT INTO lock_session (owner, principal, ttl_ms, expires_at)
		VALUES ($1, $3, $2::integer, now() + $2::integer * interval '1 millisecond')
		RETURNING `+sessionCols, owner, ttl.Milliseconds(), principal)
	s, err := scanSession(row)
	return s, b.classify("create session", err)
}

// keepAliveSQL renews a live session. It updates the session's row, so it
// conflicts with an acquire taking over one of the session's lapsed locks
// (which ends the session on that row): whichever commits second sees the
// other's effect (INV-06).
const keepAliveSQL = `
	UPDATE lock_session
	   SET last_heartbeat_at = now(), expires_at = now() + ttl_ms * interval '1 millisecond'
	 WHERE id = $1 AND lock_session_live(state, expires_at)
	RETURNING ` + sessionCols

// KeepAlive implements backend.Backend. Renewal only ever updates a live
// row: it never inserts, so an expired session cannot come back.
func (b *Backend) KeepAlive(ctx context.Context, id string) (backend.Session, error) {
	row := b.pool.QueryRow(ctx, keepAliveSQL, id)
	s, err := scanSession(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, backend.ErrSessionGone(id)
	}
	return s, b.classify("keepalive", err)
}

// closeSessionSQL closes a live session; closeEntriesSQL then frees its
// locks and ends their grants as released. They are two statements of one
// transaction, not one: the close's update waits for the session's row
// while an acquire holds it FOR SHARE, and a statement sees only what had
// committed when it began, so a delete in the same statement would miss the
// lock that acquire commits meanwhile and leave it held by a CLOSED session
// (for the reaper to end as expired). The delete begins after the update
// has the row: every acquire that granted to the session has committed by
// then, and no other can (it finds the session closed).
const closeSessionSQL = `
	UPDATE lock_session SET state = 'CLOSED', expires_at = least(expires_at, now())
	 WHERE id = $1 AND lock_session_live(state, expires_at)`

const closeEntriesSQL = `
WITH d AS (
	DELETE FROM lock_entry WHERE session_id = $1 RETURNING key, token
), g AS (
	UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'released', actor = 'session closed'
	 WHERE token = ANY (ARRAY(SELECT token FROM d)) AND ended_at IS NULL
	RETURNING token
), n AS (
	SELECT pg_notify('` + notifyChannel + `', d.key) FROM d
)
SELECT (SELECT count(*) FROM g), (SELECT count(*) FROM n)`

// CloseSession implements backend.Backend. Its delete removes several
// entries, as a batch of releases does, each in its own order: when
// PostgreSQL aborts it as a deadlock the transaction had no effect, and
// runs again. It runs at READ COMMITTED whatever the database's default,
// so that the delete takes a snapshot of its own.
func (b *Backend) CloseSession(ctx context.Context, id string) (backend.Session, error) {
	closed, err := againIfRetryable(func() (closed bool, err error) {
		err = pgx.BeginTxFunc(ctx, b.pool, pgx.TxOptions{IsoLevel: pgx.ReadCommitted}, func(tx pgx.Tx) error {
			tag, err := tx.Exec(ctx, closeSessionSQL, id)
			if err != nil || tag.RowsAffected() == 0 {
				return err
			}
			closed = true
			return tx.QueryRow(ctx, closeEntriesSQL, id).Scan(new(int64), new(int64))
		})
		return closed, err
	})
	if err != nil {
		return backend.Session{}, b.classify("close session", err)
	}
	s, err := b.Session(ctx, id)
	if err != nil {
		if problem.Has(err, problem.NotFound) {
			return s, backend.ErrSessionGone(id)
		}
		return s, err
	}
	if !closed && s.State != backend.StateClosed {
		return s, backend.ErrSessionGone(id)
	}
	return s, nil
}

// Session implements backend.Backend.
func (b *Backend) Session(ctx context.Context, id string) (backend.Session, error) {
	s, err := scanSession(b.pool.QueryRow(ctx, `SELECT `+sessionCols+` FROM lock_session WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return s, problem.New(problem.NotFound, "session %s does not exist", id)
	}
	return s, b.classify("read session", err)
}

// reapSQL is the reaper's statement (see Reap). The lapsed sessions' grants
// are ended by token through the primary key (= ANY of an array, never a
// join the planner could turn into a scan of the whole grant log).
const reapSQL = `
WITH s AS (
	UPDATE lock_session SET state = 'EXPIRED'
	 WHERE state = 'ACTIVE' AND ttl_ms > 0 AND expires_at <= now() AND NOT (SELECT lock_in_grace())
	   AND NOT lock_session_live(state, expires_at)
	RETURNING id
), d AS (
	DELETE FROM lock_entry e USING lock_session ls
	 WHERE ls.id = e.session_id AND (ls.id IN (SELECT id FROM s) OR ls.state <> 'ACTIVE')
	RETURNING e.key, e.token
), g AS (
	UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'expired', actor = 'lock-service'
	 WHERE token = ANY (ARRAY(SELECT token FROM d)) AND ended_at IS NULL
	RETURNING ` + grantCols + `
)
SELECT g.*, false, pg_notify('` + notifyChannel + `', g.key)::text FROM g`

// Reap expires every lapsed session (outside grace), frees its locks and
// ends their grants as expired, in one statement; it also frees the other
// locks of sessions an acquire ended when it took one of their keys over. Run calls it on a timer;
// it is exported for tests and tools. Its statements say ttl_ms > 0 (always
// true) to use the reaper's index, lock_session_active_expiry_idx, whose
// predicate no hot-path statement matches (lockdb migration 00005). The
// grace test runs once per statement
// first, so during a grace period lapsed rows are not each asked again
// (lock_session_live, which says the same, would ask per row).
func (b *Backend) Reap(ctx context.Context) error {
	recs, err := againIfRetryable(func() ([]backend.GrantRecord, error) {
		rows, err := b.pool.Query(ctx, reapSQL)
		if err != nil {
			return nil, err
		}
		return collectGrants(rows, true)
	})
	if err != nil {
		return b.classify("reap", err)
	}
	if len(recs) > 0 {
		b.obs().Expired(recs)
	}
	var n int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_session WHERE state = 'ACTIVE' AND ttl_ms > 0 AND lock_session_live(state, expires_at)`).Scan(&n); err == nil {
		b.obs().ActiveSessions(n)
	}
	return nil
}
