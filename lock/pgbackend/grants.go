package pgbackend

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/batcher"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// Grants: acquire, release, revoke and introspection of held keys.

// Grant log timestamps use clock_timestamp(), read while the statement
// executes (after its snapshot), so a grant never appears to start before
// the end of the grant it follows. Liveness is judged by the database's
// clock when the statement judges it, clock_timestamp() too
// (lock_session_live, lockdb migration 00007; D-11): never by now(), the
// start of the transaction, which for an acquire is before the wait for its
// keys' advisory locks.

// liveSessionCTE is both acquire statements' read of the acquiring session
// ($2): live, and locked FOR SHARE so that a statement ending it
// concurrently is waited for and no grant is made to it.
const liveSessionCTE = `sess AS (
	SELECT s.id, s.owner, s.expires_at FROM lock_session s
	 WHERE s.id = $2 AND lock_session_live(s.state, s.expires_at)
	   FOR SHARE
)`

// acquireSQL is the acquire: one conditional statement. The key is free
// when it has no entry, or its entry's session is no longer live by the
// database's clock (then the entry is taken over with a compare-and-swap on
// its token and the lapsed grant is ended as expired, in the same step). The
// grant record is written in the same statement (D-9). When the key is held
// the current entry is returned instead: by our session, that is the
// idempotent re-acquire (same token); by another, lock_held.
//
// A takeover and a keepalive of the lapsed session conflict on that
// session's row (INV-06): the takeover ends the session (EXPIRED) in the
// same statement and happens only if that update did, re-checked on the
// row's newest version. A keepalive in flight either commits first (the
// session is live again: no takeover, lock_held) or waits for the takeover
// and then finds the session expired. The acquiring session's own row is
// read FOR SHARE for the same reason: a statement that is ending it
// concurrently is waited for, and then no grant is made to it.
const acquireSQL = `
WITH ts AS MATERIALIZED (
	SELECT clock_timestamp() AS at
), ` + liveSessionCTE + `, cur AS (
	SELECT e.key, e.owner, e.session_id, e.token, e.acquired_at, ls.expires_at, ls.state,
	       lock_session_live(ls.state, ls.expires_at) AS live
	  FROM lock_entry e JOIN lock_session ls ON ls.id = e.session_id
	 WHERE e.key = $1
), lapsed AS (
	UPDATE lock_session ls SET state = 'EXPIRED'
	 WHERE ls.id = (SELECT session_id FROM cur WHERE session_id <> $2 AND NOT live)
	   AND ls.state = 'ACTIVE' AND NOT lock_session_live(ls.state, ls.expires_at)
	RETURNING ls.id
), took AS (
	UPDATE lock_entry e
	   SET owner = sess.owner, session_id = sess.id, token = nextval('lock_token_seq'), acquired_at = (SELECT at FROM ts),
	       contended = false
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
	 WHERE token = (SELECT prev_token FROM took) AND ended_at IS NULL
	RETURNING token, key, owner, session_id, granted_at, ended_at
)
SELECT 'granted' AS outcome, g.key, g.owner, g.session_id, g.token, g.acquired_at,
       (SELECT expires_at FROM sess), e.token, e.owner, e.session_id, e.granted_at, e.ended_at,
       (SELECT count(*) FROM logged), true
  FROM granted g LEFT JOIN ended e ON true
UNION ALL
SELECT 'held', c.key, c.owner, c.session_id, c.token, c.acquired_at, c.expires_at,
       NULL, NULL, NULL, NULL, NULL, 0, c.live
  FROM cur c
 WHERE NOT EXISTS (SELECT 1 FROM granted) AND EXISTS (SELECT 1 FROM sess)
UNION ALL
SELECT 'no_session', $1, '', $2, 0, now(), now(), NULL, NULL, NULL, NULL, NULL, 0, true
 WHERE NOT EXISTS (SELECT 1 FROM sess)`

// freeAcquireSQL is the acquire of free keys, the common case, in one
// conditional statement for a batch of (key, session) pairs with distinct
// keys ($1, $2): each session is read live and FOR SHARE as in acquireSQL
// (in id order, so that two batches lock them in one order), an entry is
// inserted only for a key that has none, and each grant is logged with it
// (D-9). It returns no row for a key that has an entry (held, or a lapsed
// holder's to take over) or whose session is not live; acquireSQL then
// decides, in a transaction of its own. A token is drawn only for a key
// that had no entry in the statement's snapshot.
const freeAcquireSQL = `
WITH req AS (
	SELECT r.key, r.session_id FROM unnest($1::text[], $2::text[]) AS r(key, session_id)
), sess AS (
	SELECT s.id, s.owner, s.expires_at FROM lock_session s
	 WHERE s.id = ANY ($2::text[]) AND lock_session_live(s.state, s.expires_at)
	 ORDER BY s.id
	   FOR SHARE
), fresh AS (
	INSERT INTO lock_entry (key, owner, session_id, token, acquired_at)
	SELECT req.key, sess.owner, sess.id, nextval('lock_token_seq'), clock_timestamp()
	  FROM req JOIN sess ON sess.id = req.session_id
	 WHERE NOT EXISTS (SELECT 1 FROM lock_entry e WHERE e.key = req.key)
	ON CONFLICT (key) DO NOTHING
	RETURNING key, owner, session_id, token, acquired_at
), logged AS (
	INSERT INTO lock_grant (token, key, owner, session_id, granted_at)
	SELECT token, key, owner, session_id, acquired_at FROM fresh
)
SELECT f.key, f.owner, f.session_id, f.token, s.expires_at FROM fresh f JOIN sess s ON s.id = f.session_id`

// planSettingsSQL runs first in the transaction of every acquire and
// release: for the rest of that transaction PostgreSQL prefers lookups by
// key, id or token to a sequential scan, hash join or merge join. A
// connection keeps, until the table's statistics change, the generic plan
// it made for a statement with the table sizes of that moment: made on a
// nearly empty lockdb, the batched release read lock_entry whole through a
// hash join, a cost that grew with the entries' dead rows until a vacuum
// made PostgreSQL plan again; under load, a fifth of the throughput. What
// these settings do not cover: plans made right after lockdb was analyzed
// while it held a handful of locks in a small heap can still walk a whole
// index, until the next analyze (docs/lock-service.md). Custom plans,
// made on every execution, would cover that too, at 0.3 ms of planning
// per statement: 45 % of the throughput at one client, 20 % at 32.
const planSettingsSQL = `SELECT set_config('enable_seqscan', 'off', true), set_config('enable_hashjoin', 'off', true),
	set_config('enable_mergejoin', 'off', true)`

// Acquire implements backend.Backend.
func (b *Backend) Acquire(ctx context.Context, key, sessionID string) (backend.Grant, error) {
	// A free key is granted by freeAcquireSQL alone, together with the
	// other free keys being acquired at the same moment: it costs
	// PostgreSQL less than acquireSQL, whose plan carries the held,
	// takeover and re-acquire cases too.
	g, granted, err := b.acquireFree(ctx, key, sessionID)
	if granted || (err != nil && !retryable(err)) {
		return g, err
	}
	for attempt := 0; ; attempt++ {
		g, retry, err := b.acquireOnce(ctx, key, sessionID)
		if !retry || attempt >= 20 || ctx.Err() != nil {
			return g, err
		}
	}
}

type acquireReq struct{ key, sessionID string }

type acquireRes struct {
	grant   backend.Grant
	granted bool
	err     error // of its round's statement; the batch's other rounds may have committed
}

// acquireFree grants key through freeAcquireSQL, in the statement of
// whatever other free-key acquires are in flight; granted is false when the
// key was not free (or the session not live), for acquireSQL to settle.
func (b *Backend) acquireFree(ctx context.Context, key, sessionID string) (backend.Grant, bool, error) {
	r, err := b.freeAcquires.Do(ctx, acquireReq{key, sessionID})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return backend.Grant{}, false, b.classify("acquire", err)
	}
	return r.grant, r.granted, nil
}

// acquireFreeBatch runs freeAcquireSQL for a batch of acquires, in
// rounds (batcher.InRounds). Each statement runs in one implicit transaction after
// its keys' advisory locks (sendAcquire). A deadlock or serialization
// failure grants nothing: those requests go to acquireSQL.
func (b *Backend) acquireFreeBatch(ctx context.Context, reqs []acquireReq) ([]acquireRes, error) {
	return batcher.InRounds(reqs, func(r acquireReq) string { return r.key }, func(err error) acquireRes { return acquireRes{err: err} },
		func(round []acquireReq) ([]acquireRes, error) {
			keys, sessions := make([]string, len(round)), make([]string, len(round))
			for j, r := range round {
				keys[j], sessions[j] = r.key, r.sessionID
			}
			granted, err := b.acquireFreeOnce(ctx, keys, sessions)
			if err != nil {
				return nil, err
			}
			res := make([]acquireRes, len(round))
			for j, r := range round {
				res[j].grant, res[j].granted = granted[r.key]
			}
			return res, nil
		}), nil
}

// acquireFreeOnce runs freeAcquireSQL for distinct keys and returns the
// grants it made, by key.
func (b *Backend) acquireFreeOnce(ctx context.Context, keys, sessions []string) (map[string]backend.Grant, error) {
	br, err := b.sendAcquire(ctx, keys, freeAcquireSQL, keys, sessions)
	if err != nil {
		return nil, nilIfRetryable(err)
	}
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, nilIfRetryable(err)
	}
	granted := make(map[string]backend.Grant, len(keys))
	for rows.Next() {
		var (
			g     backend.Grant
			token int64
		)
		if err := rows.Scan(&g.Key, &g.Owner, &g.SessionID, &token, &g.ServerExpiry); err != nil {
			rows.Close()
			return nil, err
		}
		g.Token = fencing.Token(token)
		granted[g.Key] = g
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, nilIfRetryable(err)
	}
	if err := br.Close(); err != nil { // the implicit transaction commits here
		return nil, nilIfRetryable(err)
	}
	return granted, nil
}

// nilIfRetryable drops a deadlock or serialization failure: the statement
// had no effect, and its requests are settled one by one.
func nilIfRetryable(err error) error {
	if retryable(err) {
		return nil
	}
	return err
}

// sendAcquire sends an acquire statement after planSettingsSQL and the
// advisory locks of its keys, in one implicit transaction (one batch, one
// round trip), and reads the answers before the statement's.
//
// A sequence hands out values in call order, not commit order: two
// acquires of one key racing inside the database could commit a token
// below one already granted (and released) for that key. Acquires of a
// key are therefore serialized by a transaction-scoped advisory lock,
// taken before the acquire statement, which then takes its snapshot with
// no other acquire of the key in flight. A statement for several keys
// takes their locks in one order (of the lock ids), so two such statements
// never wait for each other in a cycle. Releases need no lock: they mint
// nothing.
func (b *Backend) sendAcquire(ctx context.Context, keys []string, sql string, args ...any) (pgx.BatchResults, error) {
	return b.sendPlanned(ctx,
		stmt{`SELECT pg_advisory_xact_lock(l.id) FROM (
			SELECT DISTINCT hashtextextended(k, 7101) AS id FROM unnest($1::text[]) AS k ORDER BY 1) l`, []any{keys}},
		stmt{sql, args})
}

type stmt struct {
	sql  string
	args []any
}

// sendPlanned sends stmts after planSettingsSQL, in one implicit
// transaction (one round trip), and reads the answers of all but the last,
// whose answer is the caller's to read.
func (b *Backend) sendPlanned(ctx context.Context, stmts ...stmt) (pgx.BatchResults, error) {
	batch := &pgx.Batch{}
	batch.Queue(planSettingsSQL)
	for _, s := range stmts {
		batch.Queue(s.sql, s.args...)
	}
	br := b.pool.SendBatch(ctx, batch)
	for range len(stmts) { // the settings, and every statement but the last
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	return br, nil
}

// againIfRetryable runs f, and again while PostgreSQL aborts it as a
// deadlock or serialization failure (which had no effect), up to 5 times in
// all.
func againIfRetryable[T any](f func() (T, error)) (T, error) {
	var (
		v   T
		err error
	)
	for range 5 {
		if v, err = f(); !retryable(err) {
			break
		}
	}
	return v, err
}

func (b *Backend) acquireOnce(ctx context.Context, key, sessionID string) (g backend.Grant, retry bool, err error) {
	var (
		outcome                string
		token                  int64
		prevToken              *int64
		prevOwner, prevSession *string
		prevGranted, prevEnded *time.Time
		logged                 int64
		holderLive             bool
	)
	br, err := b.sendAcquire(ctx, []string{key}, acquireSQL, key, sessionID)
	if err != nil {
		return g, retryable(err), b.classify("acquire", err)
	}
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return g, retryable(err), b.classify("acquire", err)
	}
	found := false
	for rows.Next() {
		found = true
		if err := rows.Scan(&outcome, &g.Key, &g.Owner, &g.SessionID, &token, new(time.Time), &g.ServerExpiry,
			&prevToken, &prevOwner, &prevSession, &prevGranted, &prevEnded, &logged, &holderLive); err != nil {
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
		if !holderLive && g.SessionID != sessionID {
			// The holder had lapsed in our snapshot but was not taken over:
			// a keepalive renewed it first, or another statement ended it.
			// Ask again with a fresh snapshot.
			return backend.Grant{}, true, backend.ErrHeld(key, backend.Lock{})
		}
		if g.SessionID == sessionID {
			g.Existing = true
			return g, false, nil // idempotent re-acquire: the same token
		}
		b.markContended(ctx, key, g.Token)
		return backend.Grant{}, false, backend.ErrHeld(key, backend.Lock{Key: key, Held: true, Owner: g.Owner, SessionID: g.SessionID, Token: g.Token, ServerExpiry: g.ServerExpiry})
	}
	if prevToken != nil {
		b.obs().Expired([]backend.GrantRecord{{Token: fencing.Token(*prevToken), Key: key, Owner: *prevOwner, SessionID: *prevSession,
			GrantedAt: *prevGranted, EndedAt: prevEnded, EndReason: backend.EndExpired, Actor: "lock-service"}})
	}
	return g, false, nil
}

// releaseSQL is the release: one conditional statement for a batch of
// (key, session, token) triples with distinct keys ($1, $2, $3):
// compare-and-delete on each triple by a live session, ending its grant in
// the same statement. Every row it touches is found by key or token.
const releaseSQL = `
WITH req AS (
	SELECT r.key, r.session_id, r.token FROM unnest($1::text[], $2::text[], $3::bigint[]) AS r(key, session_id, token)
), d AS (
	DELETE FROM lock_entry e USING req
	 WHERE e.key = req.key AND e.session_id = req.session_id AND e.token = req.token
	   AND EXISTS (SELECT 1 FROM lock_session s WHERE s.id = req.session_id AND lock_session_live(s.state, s.expires_at))
	RETURNING e.key, e.token, e.contended
), g AS (
	UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'released', actor = owner
	 WHERE token = ANY (ARRAY(SELECT token FROM d)) AND ended_at IS NULL
	RETURNING ` + grantCols + `
)
SELECT g.*, d.contended, CASE WHEN d.contended THEN pg_notify('` + notifyChannel + `', g.key)::text END
  FROM g JOIN d ON d.token = g.token`

type releaseReq struct {
	key, sessionID string
	token          fencing.Token
}

type releaseRes struct {
	rec      backend.GrantRecord
	released bool
	err      error // of its round's statement; the batch's other rounds may have committed
}

// Release implements backend.Backend: compare-and-delete on (key, session,
// token), by a live session, in the statement of whatever other releases
// are in flight.
func (b *Backend) Release(ctx context.Context, key, sessionID string, token fencing.Token) (backend.GrantRecord, error) {
	r, err := b.releases.Do(ctx, releaseReq{key, sessionID, token})
	if err == nil {
		err = r.err
	}
	if err != nil {
		return backend.GrantRecord{}, b.classify("release", err)
	}
	if !r.released {
		return backend.GrantRecord{}, backend.ErrNotHeld(key, sessionID, token)
	}
	// Waiters on this process are woken directly; those on other lock
	// service processes by the notification, sent when one of them found
	// the key held (markContended).
	b.signal(key)
	return r.rec, nil
}

// releaseBatch runs releaseSQL for a batch of releases, in rounds
// (batcher.InRounds). A statement that PostgreSQL aborts as a deadlock or
// serialization failure (two statements deleting entries in different
// orders) had no effect and runs again.
func (b *Backend) releaseBatch(ctx context.Context, reqs []releaseReq) ([]releaseRes, error) {
	return batcher.InRounds(reqs, func(r releaseReq) string { return r.key }, func(err error) releaseRes { return releaseRes{err: err} },
		func(round []releaseReq) ([]releaseRes, error) {
			keys, sessions, tokens := make([]string, len(round)), make([]string, len(round)), make([]int64, len(round))
			for j, r := range round {
				keys[j], sessions[j], tokens[j] = r.key, r.sessionID, int64(r.token)
			}
			recs, err := againIfRetryable(func() ([]backend.GrantRecord, error) { return b.releaseOnce(ctx, keys, sessions, tokens) })
			if err != nil {
				return nil, err
			}
			ended := make(map[string]backend.GrantRecord, len(recs))
			for _, r := range recs {
				ended[r.Key] = r
			}
			res := make([]releaseRes, len(round))
			for j, r := range round {
				res[j].rec, res[j].released = ended[r.key]
			}
			return res, nil
		}), nil
}

// releaseOnce runs releaseSQL after planSettingsSQL, in one implicit
// transaction (one round trip).
func (b *Backend) releaseOnce(ctx context.Context, keys, sessions []string, tokens []int64) ([]backend.GrantRecord, error) {
	br, err := b.sendPlanned(ctx, stmt{releaseSQL, []any{keys, sessions, tokens}})
	if err != nil {
		return nil, err
	}
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	recs, err := collectGrants(rows, true)
	if err != nil {
		return nil, err
	}
	return recs, br.Close() // the implicit transaction commits here
}

// revokeSQL ends the live grant of key $1 as revoked by actor $2 for
// reason $3. It runs after the key's advisory lock (sendAcquire): an
// acquire taking the key over from a lapsed holder has then committed, and
// this statement's snapshot sees the grant it wrote. Without the lock the
// DELETE, waiting on the entry's row, went on to delete the new holder's
// entry while the UPDATE, on the older snapshot, could not see its grant:
// the key was freed, its grant left open for good, and "not held"
// answered. A holder whose session has lapsed is not revoked: the key is
// free already, and the reaper ends that grant as expired.
const revokeSQL = `
WITH d AS (
	DELETE FROM lock_entry e WHERE e.key = $1
	   AND EXISTS (SELECT 1 FROM lock_session s WHERE s.id = e.session_id AND lock_session_live(s.state, s.expires_at))
	RETURNING e.key, e.token, e.contended
), g AS (
	UPDATE lock_grant SET ended_at = clock_timestamp(), end_reason = 'revoked', actor = $2, reason = $3
	 WHERE token = ANY (ARRAY(SELECT token FROM d)) AND ended_at IS NULL
	RETURNING ` + grantCols + `
)
SELECT g.*, d.contended, pg_notify('` + notifyChannel + `', g.key)::text FROM g JOIN d ON d.token = g.token`

// Revoke implements backend.Backend.
func (b *Backend) Revoke(ctx context.Context, key, actor, reason string) (backend.GrantRecord, error) {
	br, err := b.sendAcquire(ctx, []string{key}, revokeSQL, key, actor, reason)
	if err != nil {
		return backend.GrantRecord{}, b.classify("revoke", err)
	}
	defer br.Close()
	rows, err := br.Query()
	if err != nil {
		return backend.GrantRecord{}, b.classify("revoke", err)
	}
	recs, err := collectGrants(rows, true)
	if err == nil {
		err = br.Close() // the implicit transaction commits here
	}
	if err != nil {
		return backend.GrantRecord{}, b.classify("revoke", err)
	}
	if len(recs) == 0 {
		return backend.GrantRecord{}, backend.ErrFree(key)
	}
	return recs[0], nil
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

// markContended asks the release of key's current grant (token) to wake
// waiters, when an acquire on this process is waiting for key. If the
// grant has already changed, the waiters are woken now instead.
func (b *Backend) markContended(ctx context.Context, key string, token fencing.Token) {
	if !b.waiters.Has(key) {
		return
	}
	tag, err := b.pool.Exec(ctx, `UPDATE lock_entry SET contended = true WHERE key = $1 AND token = $2 AND NOT contended`, key, int64(token))
	if err != nil {
		return // the waiter still retries on its timer
	}
	if tag.RowsAffected() == 0 {
		var still bool
		if b.pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM lock_entry WHERE key = $1 AND token = $2)`, key, int64(token)).Scan(&still) == nil && !still {
			b.signal(key)
		}
	}
}
