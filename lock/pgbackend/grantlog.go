package pgbackend

import (
	"context"
	"fmt"
	"maps"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

// The grant log (D-9) and the token sequence (D-2, D-13).

const grantCols = `token, key, owner, session_id, granted_at, ended_at, end_reason, actor, reason`

// collectGrants reads grant records; withNotify: rows of a statement that
// ends grants, with two more columns, whether a waiter had marked the grant
// contended (Waited) and its notification.
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
			dest = append(dest, &r.Waited, &n)
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

// BumpTokens moves lock_token_seq up so that every future token is above
// to (D-13). It refuses to move the sequence down or to a value at or below
// a token already issued, and holds off concurrent acquires while it runs.
func BumpTokens(ctx context.Context, databaseURL string, to fencing.Token) (from fencing.Token, err error) {
	return bumpTokens(ctx, databaseURL, to, false)
}

// BumpTokensAtLeast is BumpTokens for a floor computed from the guards'
// fences: when tokens above to were already issued, every future token is
// above to already, and it changes nothing.
func BumpTokensAtLeast(ctx context.Context, databaseURL string, to fencing.Token) (from fencing.Token, err error) {
	return bumpTokens(ctx, databaseURL, to, true)
}

func bumpTokens(ctx context.Context, databaseURL string, to fencing.Token, floor bool) (from fencing.Token, err error) {
	if !to.Valid() {
		return 0, fmt.Errorf("bump-tokens: --to %d is not a valid token (1 .. 2^53-1)", int64(to))
	}
	cc, err := pgx.ParseConfig(databaseURL)
	if err != nil {
		return 0, fmt.Errorf("bump-tokens: parse database URL: %w", err)
	}
	// The bump is reported done only once its commit is durable, whatever
	// lockdb's default: with asynchronous commit a crash right after could
	// lose it, and the sequence would issue tokens the guards have seen
	// (INV-04). The same settings as the service's pool (Open).
	maps.Copy(cc.RuntimeParams, pgpool.DurableCommits())
	conn, err := pgx.ConnectConfig(ctx, cc)
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
	if to < cur && floor {
		return cur, tx.Commit(ctx)
	}
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

// compactBatch bounds one compaction statement.
const compactBatch = 10000

// Compact deletes, in batches, ended grants older than the retention
// (always keeping the newest grant, so the high token stays known) and then
// ended sessions older than the retention that no grant or lock refers to.
// It reports how many of each it deleted. Run calls it every
// CompactInterval; it is exported for tests and tools. Old grants are found
// through lock_grant_granted_idx: a grant ends after it starts, so every
// grant ended before the cutoff was also granted before it (ended_at is not
// indexed, so that a release's update of it writes no index entry).
func (b *Backend) Compact(ctx context.Context) (grants, sessions int64, err error) {
	if b.cfg.GrantRetention <= 0 {
		return 0, 0, nil
	}
	ms := b.cfg.GrantRetention.Milliseconds()
	for {
		var n, m int64
		err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `SELECT set_config('payouts.compacting', 'on', true)`); err != nil {
				return err
			}
			tag, err := tx.Exec(ctx, `
				DELETE FROM lock_grant WHERE token IN (
					SELECT token FROM lock_grant
					 WHERE granted_at < now() - $1 * interval '1 millisecond'
					   AND ended_at < now() - $1 * interval '1 millisecond'
					   AND token < (SELECT max(token) FROM lock_grant)
					 ORDER BY granted_at LIMIT $2)`, ms, compactBatch)
			if err != nil {
				return err
			}
			n = tag.RowsAffected()
			tag, err = tx.Exec(ctx, `
				DELETE FROM lock_session WHERE id IN (
					SELECT s.id FROM lock_session s
					 WHERE s.state <> 'ACTIVE' AND s.expires_at < now() - $1 * interval '1 millisecond'
					   AND NOT EXISTS (SELECT 1 FROM lock_grant g WHERE g.session_id = s.id)
					   AND NOT EXISTS (SELECT 1 FROM lock_entry e WHERE e.session_id = s.id)
					 LIMIT $2)`, ms, compactBatch)
			if err != nil {
				return err
			}
			m = tag.RowsAffected()
			return nil
		})
		if err != nil {
			return grants, sessions, b.classify("compact grant log", err)
		}
		grants, sessions = grants+n, sessions+m
		if n < compactBatch && m < compactBatch {
			return grants, sessions, nil
		}
	}
}
