// Package pgbackend is the lock service's PostgreSQL backend (lockdb).
//
// Every decision is one conditional SQL statement evaluated with the
// database's now(), never the lock server's clock (D-11); tokens come from
// lock_token_seq, which is never reset (D-2); and the grant log is written in
// the same statement as the grant (D-9). Liveness of a session is defined
// once, by the SQL function lock_session_live, which also applies the grace
// period of D-12.
package pgbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// notifyChannel carries the key of every lock that became free.
const notifyChannel = "payouts_lock_free"

// Config configures the backend.
type Config struct {
	DatabaseURL string
	Logger      *slog.Logger
	// ReapInterval is how often lapsed sessions are expired and the
	// database identity is checked (default 250ms).
	ReapInterval time.Duration
	// MaxConns bounds the pool (default 16).
	MaxConns int32
}

// Backend implements backend.Backend on PostgreSQL.
type Backend struct {
	pool *pgxpool.Pool
	cfg  Config
	log  *slog.Logger

	mu       sync.Mutex
	observer backend.Observer
	waiters  backend.Waiters
	listener *pgx.Conn // handed to Run's listen loop
}

var _ backend.Backend = (*Backend)(nil)

// Open connects to lockdb. The schema must be migrated.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.DatabaseURL == "" {
		return nil, errors.New("pgbackend: database URL is required")
	}
	if cfg.ReapInterval <= 0 {
		cfg.ReapInterval = 250 * time.Millisecond
	}
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 16
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("pgbackend: parse database URL: %w", err)
	}
	pc.MaxConns = cfg.MaxConns
	// A grant is answered only after its commit is durable: with
	// asynchronous commit a crash could lose a committed nextval and the
	// sequence would issue the same token again (INV-04).
	pc.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("pgbackend: connect: %w", err)
	}
	b := &Backend{pool: pool, cfg: cfg, log: cfg.Logger, observer: backend.NopObserver{}}
	if err := b.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgbackend: %w", err)
	}
	var ok bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('lock_epoch') IS NOT NULL`).Scan(&ok); err != nil || !ok {
		pool.Close()
		return nil, errors.New("pgbackend: lockdb is not migrated (run payouts migrate --db lockdb, or start with --migrate)")
	}
	// D-12: the lock service is starting, so no client could renew while it
	// was away. Start the grace period before serving anything.
	if err := b.checkEpoch(ctx, true); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgbackend: %w", err)
	}
	// Listen before serving, so no release after Open goes unheard.
	if b.listener, err = b.startListening(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgbackend: listen: %w", err)
	}
	return b, nil
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "postgres" }

// SetObserver implements backend.Backend.
func (b *Backend) SetObserver(o backend.Observer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.observer = o
}

func (b *Backend) obs() backend.Observer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.observer
}

// Ping implements backend.Backend.
func (b *Backend) Ping(ctx context.Context) error {
	if err := b.pool.Ping(ctx); err != nil {
		return backend.Unavailable("ping", err)
	}
	return nil
}

// Close implements backend.Backend.
func (b *Backend) Close() error {
	b.mu.Lock()
	if b.listener != nil { // Run never started
		b.listener.Close(context.Background())
		b.listener = nil
	}
	b.mu.Unlock()
	b.pool.Close()
	return nil
}

// classify turns a database error into a problem: connection-level failures
// are unavailable (the effect of a commit in flight is unknown, which every
// caller of the lock service already handles), the rest internal.
func classifyErr(what string, err error) error {
	if err == nil {
		return nil
	}
	var p *problem.Error
	if errors.As(err, &p) {
		return p
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return problem.Wrap(problem.Unavailable, err, "%s: the lock store did not answer in time", what)
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code[:2] {
		case "08", "57", "53": // connection exception, operator intervention (shutdown), resources
			return backend.Unavailable(what, err)
		}
		return problem.Wrap(problem.Internal, err, "%s failed", what)
	}
	// No PostgreSQL error: the connection failed.
	return backend.Unavailable(what, err)
}

// classify is classifyErr that also drops every pooled connection when the
// database was unreachable: after a restart or failover the idle ones are
// all dead, and each would otherwise fail one request.
func (b *Backend) classify(what string, err error) error {
	out := classifyErr(what, err)
	if problem.Has(out, problem.Unavailable) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		b.pool.Reset()
	}
	return out
}

// retryable reports a serialization failure or deadlock: the statement had
// no effect and may run again.
func retryable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

const sessionCols = `id, owner, ttl_ms, state, created_at, last_heartbeat_at, expires_at,
	lock_session_live(state, expires_at) AS live, now() AS db_now`

func scanSession(row pgx.Row) (backend.Session, error) {
	var (
		s     backend.Session
		ttlMS int64
		live  bool
		now   time.Time
	)
	if err := row.Scan(&s.ID, &s.Owner, &ttlMS, &s.State, &s.CreatedAt, &s.LastHeartbeatAt, &s.ExpiresAt, &live, &now); err != nil {
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
func (b *Backend) CreateSession(ctx context.Context, owner string, ttl time.Duration) (backend.Session, error) {
	row := b.pool.QueryRow(ctx, `
		INSERT INTO lock_session (owner, ttl_ms, expires_at)
		VALUES ($1, $2::integer, now() + $2::integer * interval '1 millisecond')
		RETURNING `+sessionCols, owner, ttl.Milliseconds())
	s, err := scanSession(row)
	return s, b.classify("create session", err)
}

// KeepAlive implements backend.Backend. Renewal only ever updates a live
// row: it never inserts, so an expired session cannot come back.
func (b *Backend) KeepAlive(ctx context.Context, id string) (backend.Session, error) {
	row := b.pool.QueryRow(ctx, `
		UPDATE lock_session
		   SET last_heartbeat_at = now(), expires_at = now() + ttl_ms * interval '1 millisecond'
		 WHERE id = $1 AND lock_session_live(state, expires_at)
		RETURNING `+sessionCols, id)
	s, err := scanSession(row)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, backend.ErrSessionGone(id)
	}
	return s, b.classify("keepalive", err)
}

// CloseSession implements backend.Backend.
func (b *Backend) CloseSession(ctx context.Context, id string) (backend.Session, error) {
	var closed bool
	err := b.pool.QueryRow(ctx, `
		WITH s AS (
			UPDATE lock_session SET state = 'CLOSED'
			 WHERE id = $1 AND lock_session_live(state, expires_at)
			RETURNING id
		), d AS (
			DELETE FROM lock_entry WHERE session_id IN (SELECT id FROM s) RETURNING key, token
		), g AS (
			UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'released', actor = 'session closed'
			 WHERE token IN (SELECT token FROM d) AND ended_at IS NULL
			RETURNING token
		), n AS (
			SELECT pg_notify('`+notifyChannel+`', d.key) FROM d
		)
		SELECT EXISTS (SELECT 1 FROM s), (SELECT count(*) FROM g), (SELECT count(*) FROM n)`, id).Scan(&closed, new(int64), new(int64))
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

// Grant log timestamps use clock_timestamp(), read while the statement
// executes (after its snapshot), so a grant never appears to start before
// the end of the grant it follows; expiry decisions use now() (D-11).

// acquireSQL is the acquire: one conditional statement. The key is free
// when it has no entry, or its entry's session is no longer live by the
// database's now() (then the entry is taken over with a compare-and-swap on
// its token and the lapsed grant is ended as expired, in the same step). The
// grant record is written in the same statement (D-9). When the key is held
// the current entry is returned instead: by our session, that is the
// idempotent re-acquire (same token); by another, lock_held.
const acquireSQL = `
WITH ts AS MATERIALIZED (
	SELECT clock_timestamp() AS at
), sess AS (
	SELECT s.id, s.owner, s.expires_at FROM lock_session s
	 WHERE s.id = $2 AND lock_session_live(s.state, s.expires_at)
), cur AS (
	SELECT e.key, e.owner, e.session_id, e.token, e.acquired_at, ls.expires_at,
	       lock_session_live(ls.state, ls.expires_at) AS live
	  FROM lock_entry e JOIN lock_session ls ON ls.id = e.session_id
	 WHERE e.key = $1
), took AS (
	UPDATE lock_entry e
	   SET owner = sess.owner, session_id = sess.id, token = nextval('lock_token_seq'), acquired_at = (SELECT at FROM ts)
	  FROM sess, cur
	 WHERE e.key = $1 AND e.token = cur.token AND ` + takeoverSQL + `
	RETURNING e.key, e.owner, e.session_id, e.token, e.acquired_at, cur.token AS prev_token
), fresh AS (
	INSERT INTO lock_entry (key, owner, session_id, token, acquired_at)
	SELECT $1, sess.owner, sess.id, nextval('lock_token_seq'), (SELECT at FROM ts) FROM sess
	 WHERE NOT EXISTS (SELECT 1 FROM cur)
	ON CONFLICT (key) DO NOTHING
	RETURNING key, owner, session_id, token, acquired_at
), granted AS (
	SELECT key, owner, session_id, token, acquired_at, prev_token FROM took
	UNION ALL
	SELECT key, owner, session_id, token, acquired_at, NULL::bigint FROM fresh
), logged AS (
	INSERT INTO lock_grant (token, key, owner, session_id, granted_at)
	SELECT token, key, owner, session_id, acquired_at FROM granted
	RETURNING token
), ended AS (
	UPDATE lock_grant
	   SET ended_at = (SELECT at FROM ts), end_reason = 'expired', actor = 'lock-service'
	 WHERE token IN (SELECT prev_token FROM took) AND ended_at IS NULL
	RETURNING token, key, owner, session_id, granted_at, ended_at
)
SELECT 'granted' AS outcome, g.key, g.owner, g.session_id, g.token, g.acquired_at,
       (SELECT expires_at FROM sess), e.token, e.owner, e.session_id, e.granted_at, e.ended_at,
       (SELECT count(*) FROM logged)
  FROM granted g LEFT JOIN ended e ON true
UNION ALL
SELECT 'held', c.key, c.owner, c.session_id, c.token, c.acquired_at, c.expires_at,
       NULL, NULL, NULL, NULL, NULL, 0
  FROM cur c
 WHERE NOT EXISTS (SELECT 1 FROM granted) AND EXISTS (SELECT 1 FROM sess)
UNION ALL
SELECT 'no_session', $1, '', $2, 0, now(), now(), NULL, NULL, NULL, NULL, NULL, 0
 WHERE NOT EXISTS (SELECT 1 FROM sess)`

// Acquire implements backend.Backend.
func (b *Backend) Acquire(ctx context.Context, key, sessionID string) (backend.Grant, error) {
	for attempt := 0; ; attempt++ {
		g, retry, err := b.acquireOnce(ctx, key, sessionID)
		if !retry || attempt >= 20 || ctx.Err() != nil {
			return g, err
		}
	}
}

func (b *Backend) acquireOnce(ctx context.Context, key, sessionID string) (g backend.Grant, retry bool, err error) {
	var (
		outcome                string
		token                  int64
		prevToken              *int64
		prevOwner, prevSession *string
		prevGranted, prevEnded *time.Time
		logged                 int64
	)
	// A sequence hands out values in call order, not commit order: two
	// acquires of one key racing inside the database could commit a token
	// below one already granted (and released) for that key. Acquires of a
	// key are therefore serialized by a transaction-scoped advisory lock,
	// taken in the same implicit transaction (one batch, one round trip)
	// before the acquire statement, which then takes its snapshot with no
	// other acquire of the key in flight. Releases need no lock: they mint
	// nothing.
	batch := &pgx.Batch{}
	batch.Queue(`SELECT pg_advisory_xact_lock(hashtextextended($1, 7101))`, key)
	batch.Queue(acquireSQL, key, sessionID)
	br := b.pool.SendBatch(ctx, batch)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return g, retryable(err), b.classify("acquire", err)
	}
	rows, err := br.Query()
	if err != nil {
		return g, retryable(err), b.classify("acquire", err)
	}
	found := false
	for rows.Next() {
		found = true
		if err := rows.Scan(&outcome, &g.Key, &g.Owner, &g.SessionID, &token, new(time.Time), &g.ServerExpiry,
			&prevToken, &prevOwner, &prevSession, &prevGranted, &prevEnded, &logged); err != nil {
			rows.Close()
			return g, false, b.classify("acquire", err)
		}
		g.Token = fencing.Token(token)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return backend.Grant{}, retryable(err), b.classify("acquire", err)
	}
	if err := br.Close(); err != nil { // the implicit transaction commits here
		return backend.Grant{}, retryable(err), b.classify("acquire", err)
	}
	if !found {
		// A concurrent acquire inserted the entry after our snapshot: ask again.
		return backend.Grant{}, true, backend.ErrHeld(key, backend.Lock{})
	}
	switch outcome {
	case "no_session":
		return backend.Grant{}, false, backend.ErrSessionGone(sessionID)
	case "held":
		if g.SessionID == sessionID {
			g.Existing = true
			return g, false, nil // idempotent re-acquire: the same token
		}
		return backend.Grant{}, false, backend.ErrHeld(key, backend.Lock{Key: key, Held: true, Owner: g.Owner, SessionID: g.SessionID, Token: g.Token, ServerExpiry: g.ServerExpiry})
	}
	if prevToken != nil {
		b.obs().Expired([]backend.GrantRecord{{Token: fencing.Token(*prevToken), Key: key, Owner: *prevOwner, SessionID: *prevSession,
			GrantedAt: *prevGranted, EndedAt: prevEnded, EndReason: backend.EndExpired, Actor: "lock-service"}})
	}
	return g, false, nil
}

// Release implements backend.Backend: compare-and-delete on (key, session,
// token), by a live session.
func (b *Backend) Release(ctx context.Context, key, sessionID string, token fencing.Token) (backend.GrantRecord, error) {
	rows, err := b.pool.Query(ctx, `
		WITH d AS (
			DELETE FROM lock_entry e USING lock_session s
			 WHERE e.key = $1 AND e.session_id = $2 AND e.token = $3
			   AND s.id = e.session_id AND lock_session_live(s.state, s.expires_at)
			RETURNING e.key, e.token
		), g AS (
			UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'released', actor = owner
			 WHERE token IN (SELECT token FROM d) AND ended_at IS NULL
			RETURNING `+grantCols+`
		)
		SELECT g.*, pg_notify('`+notifyChannel+`', g.key)::text FROM g`, key, sessionID, int64(token))
	if err != nil {
		return backend.GrantRecord{}, b.classify("release", err)
	}
	recs, err := collectGrants(rows, true)
	if err != nil {
		return backend.GrantRecord{}, b.classify("release", err)
	}
	if len(recs) == 0 {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, sessionID, token)
	}
	return recs[0], nil
}

// Revoke implements backend.Backend.
func (b *Backend) Revoke(ctx context.Context, key, actor, reason string) (backend.GrantRecord, error) {
	rows, err := b.pool.Query(ctx, `
		WITH d AS (
			DELETE FROM lock_entry WHERE key = $1 RETURNING key, token
		), g AS (
			UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'revoked', actor = $2, reason = $3
			 WHERE token IN (SELECT token FROM d) AND ended_at IS NULL
			RETURNING `+grantCols+`
		)
		SELECT g.*, pg_notify('`+notifyChannel+`', g.key)::text FROM g`, key, actor, reason)
	if err != nil {
		return backend.GrantRecord{}, b.classify("revoke", err)
	}
	recs, err := collectGrants(rows, true)
	if err != nil {
		return backend.GrantRecord{}, b.classify("revoke", err)
	}
	if len(recs) == 0 {
		return backend.GrantRecord{}, backend.ErrFree(key)
	}
	return recs[0], nil
}

const grantCols = `token, key, owner, session_id, granted_at, ended_at, end_reason, actor, reason`

func collectGrants(rows pgx.Rows, withNotify bool) ([]backend.GrantRecord, error) {
	defer rows.Close()
	var out []backend.GrantRecord
	for rows.Next() {
		var (
			r                           backend.GrantRecord
			token                       int64
			endReason, actor, reason, n *string
		)
		dest := []any{&token, &r.Key, &r.Owner, &r.SessionID, &r.GrantedAt, &r.EndedAt, &endReason, &actor, &reason}
		if withNotify {
			dest = append(dest, &n)
		}
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		r.Token = fencing.Token(token)
		r.EndReason, r.Actor, r.Reason = deref(endReason), deref(actor), deref(reason)
		out = append(out, r)
	}
	return out, rows.Err()
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

const lockSelect = `
	SELECT e.key, e.owner, e.session_id, e.token, e.acquired_at, s.expires_at
	  FROM lock_entry e JOIN lock_session s ON s.id = e.session_id
	 WHERE lock_session_live(s.state, s.expires_at)`

func scanLock(row pgx.Row) (backend.Lock, error) {
	var (
		l     backend.Lock
		token int64
	)
	err := row.Scan(&l.Key, &l.Owner, &l.SessionID, &token, &l.AcquiredAt, &l.ServerExpiry)
	l.Token, l.Held = fencing.Token(token), err == nil
	return l, err
}

// Lock implements backend.Backend. A lapsed session's entry is shown free.
func (b *Backend) Lock(ctx context.Context, key string) (backend.Lock, error) {
	l, err := scanLock(b.pool.QueryRow(ctx, lockSelect+` AND e.key = $1`, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return backend.Lock{Key: key}, nil
	}
	return l, b.classify("read lock", err)
}

// Locks implements backend.Backend.
func (b *Backend) Locks(ctx context.Context, prefix string, limit int) ([]backend.Lock, error) {
	rows, err := b.pool.Query(ctx, lockSelect+` AND starts_with(e.key, $1) ORDER BY e.key LIMIT $2`, prefix, limit)
	if err != nil {
		return nil, b.classify("list locks", err)
	}
	defer rows.Close()
	var out []backend.Lock
	for rows.Next() {
		l, err := scanLock(rows)
		if err != nil {
			return nil, b.classify("list locks", err)
		}
		out = append(out, l)
	}
	return out, b.classify("list locks", rows.Err())
}

// Grants implements backend.Backend.
func (b *Backend) Grants(ctx context.Context, after fencing.Token, limit int) ([]backend.GrantRecord, error) {
	rows, err := b.pool.Query(ctx, `SELECT `+grantCols+` FROM lock_grant WHERE token > $1 ORDER BY token LIMIT $2`, int64(after), limit)
	if err != nil {
		return nil, b.classify("list grants", err)
	}
	recs, err := collectGrants(rows, false)
	return recs, b.classify("list grants", err)
}

// HighToken implements backend.Backend: the sequence's position, which is at
// least every token ever issued (tokens burned by a losing race count too).
func (b *Backend) HighToken(ctx context.Context) (fencing.Token, error) {
	var (
		last   int64
		called bool
		maxG   int64
	)
	err := b.pool.QueryRow(ctx, `SELECT last_value, is_called, (SELECT coalesce(max(token), 0) FROM lock_grant) FROM lock_token_seq`).Scan(&last, &called, &maxG)
	if err != nil {
		return 0, b.classify("read high token", err)
	}
	if !called {
		last--
	}
	return fencing.Token(max(last, maxG)), nil
}

// Changed implements backend.Backend: signalled by LISTEN/NOTIFY (Run).
func (b *Backend) Changed(key string) (<-chan struct{}, func()) { return b.waiters.Changed(key) }

func (b *Backend) signal(key string) { b.waiters.Signal(key) }

// Run implements backend.Backend: the reaper, failover detection and the
// LISTEN loop, until ctx ends.
func (b *Backend) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); b.listen(ctx) }()
	go func() { defer wg.Done(); b.reapLoop(ctx) }()
	wg.Wait()
	return nil
}

func (b *Backend) reapLoop(ctx context.Context) {
	t := time.NewTicker(b.cfg.ReapInterval)
	defer t.Stop()
	for {
		if err := b.checkEpoch(ctx, false); err == nil {
			if err := b.Reap(ctx); err != nil && ctx.Err() == nil {
				b.log.Warn("lock reaper failed; will retry", "error", err.Error())
			}
		} else if ctx.Err() == nil {
			b.log.Warn("lock store unreachable; will retry", "error", err.Error())
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
	b.obs().Grace(until, why)
	return nil
}

// Reap expires every lapsed session (outside grace), frees its locks and
// ends their grants as expired, in one statement. Run calls it on a timer;
// it is exported for tests and tools.
func (b *Backend) Reap(ctx context.Context) error {
	for attempt := 0; ; attempt++ {
		rows, err := b.pool.Query(ctx, `
			WITH s AS (
				UPDATE lock_session SET state = 'EXPIRED'
				 WHERE state = 'ACTIVE' AND expires_at <= now() AND NOT lock_session_live(state, expires_at)
				RETURNING id
			), d AS (
				DELETE FROM lock_entry WHERE session_id IN (SELECT id FROM s) RETURNING key, token
			), g AS (
				UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'expired', actor = 'lock-service'
				 WHERE token IN (SELECT token FROM d) AND ended_at IS NULL
				RETURNING `+grantCols+`
			)
			SELECT g.*, pg_notify('`+notifyChannel+`', g.key)::text FROM g`)
		if err != nil {
			if retryable(err) && attempt < 5 {
				continue
			}
			return b.classify("reap", err)
		}
		recs, err := collectGrants(rows, true)
		if err != nil {
			if retryable(err) && attempt < 5 {
				continue
			}
			return b.classify("reap", err)
		}
		if len(recs) > 0 {
			b.obs().Expired(recs)
		}
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM lock_session WHERE state = 'ACTIVE' AND lock_session_live(state, expires_at)`).Scan(&n); err == nil {
			b.obs().ActiveSessions(n)
		}
		return nil
	}
}

// listen holds one connection in LISTEN and wakes local waiters, reconnecting
// after failures. While it is down, waiters fall back to their timer.
func (b *Backend) listen(ctx context.Context) {
	for ctx.Err() == nil {
		err := b.listenOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		b.log.Warn("lock notification listener lost its connection; reconnecting", "error", err.Error())
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

func (b *Backend) listenOnce(ctx context.Context) error {
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
	defer conn.Close(context.Background())
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		b.signal(n.Payload)
	}
}

// BumpTokens moves lock_token_seq up so that every future token is above
// to (D-13). It refuses to move the sequence down or to a value at or below
// a token already issued, and holds off concurrent acquires while it runs.
func BumpTokens(ctx context.Context, databaseURL string, to fencing.Token) (from fencing.Token, err error) {
	if !to.Valid() {
		return 0, fmt.Errorf("bump-tokens: --to %d is not a valid token (1 .. 2^53-1)", int64(to))
	}
	conn, err := pgx.Connect(ctx, databaseURL)
	if err != nil {
		return 0, fmt.Errorf("bump-tokens: connect: %w", err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(ctx)
	if err != nil {
		return 0, err
	}
	defer tx.Rollback(context.Background())
	// Every acquire writes lock_entry and lock_grant: holding these locks
	// means no nextval can run between the check and the setval.
	if _, err := tx.Exec(ctx, `LOCK TABLE lock_entry, lock_grant IN SHARE ROW EXCLUSIVE MODE`); err != nil {
		return 0, fmt.Errorf("bump-tokens: lock tables: %w", err)
	}
	var (
		last   int64
		called bool
		maxG   int64
	)
	if err := tx.QueryRow(ctx, `SELECT last_value, is_called, (SELECT coalesce(max(token), 0) FROM lock_grant) FROM lock_token_seq`).Scan(&last, &called, &maxG); err != nil {
		return 0, fmt.Errorf("bump-tokens: read sequence: %w", err)
	}
	if !called {
		last--
	}
	cur := fencing.Token(max(last, maxG))
	if to < cur {
		return cur, fmt.Errorf("bump-tokens: refusing to move tokens down: tokens up to %d were already issued, --to %d is lower", int64(cur), int64(to))
	}
	if to == cur {
		return cur, tx.Commit(ctx)
	}
	if _, err := tx.Exec(ctx, `SELECT setval('lock_token_seq', $1, true)`, int64(to)); err != nil {
		return cur, fmt.Errorf("bump-tokens: setval: %w", err)
	}
	return cur, tx.Commit(ctx)
}
