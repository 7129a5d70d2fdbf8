package pgbackend

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/migrations"
)

// planNode is the part of EXPLAIN (ANALYZE, FORMAT JSON) a row count needs.
type planNode struct {
	NodeType    string     `json:"Node Type"`
	Relation    string     `json:"Relation Name"`
	Index       string     `json:"Index Name"`
	Rows        float64    `json:"Actual Rows"`
	Loops       float64    `json:"Actual Loops"`
	FilteredOut float64    `json:"Rows Removed by Filter"`
	Rechecked   float64    `json:"Rows Removed by Index Recheck"`
	SharedHit   float64    `json:"Shared Hit Blocks"`
	SharedRead  float64    `json:"Shared Read Blocks"`
	Plans       []planNode `json:"Plans"`
}

// rowsRead sums the rows of table (and entries of its indexes) every node
// of a plan read, kept or filtered out.
func rowsRead(n planNode, table string) float64 {
	total := 0.0
	if n.Relation == table || strings.HasPrefix(n.Index, table) {
		total += (n.Rows + n.FilteredOut + n.Rechecked) * n.Loops
	}
	for _, c := range n.Plans {
		total += rowsRead(c, table)
	}
	return total
}

// explainRowsRead runs sql under EXPLAIN ANALYZE in a transaction it rolls
// back, with the given plan_cache_mode, and returns the rows of table the
// plan read.
func explainRowsRead(t *testing.T, ctx context.Context, b *Backend, mode, table, sql string, args ...any) float64 {
	t.Helper()
	var rows float64
	err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT set_config('plan_cache_mode', $1, true)`, mode); err != nil {
			return err
		}
		var out []byte
		if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+sql, args...).Scan(&out); err != nil {
			return err
		}
		var plans []struct {
			Plan planNode `json:"Plan"`
		}
		if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
			t.Fatalf("EXPLAIN output %s: %v", out, err)
		}
		rows = rowsRead(plans[0].Plan, table)
		return errRollback
	})
	if err != errRollback {
		t.Fatal(err)
	}
	return rows
}

type rollback struct{}

func (rollback) Error() string { return "rolled back on purpose" }

var errRollback error = rollback{}

// TestHotPathCostIndependentOfLiveSessions: with thousands of live
// sessions, each holding a lock, an acquire (of a free key, of a held key,
// taking over a lapsed holder) and a release each read a handful of
// session, lock and grant rows, by id, key or token, whatever plan PostgreSQL picks (custom or generic, statistics skewed or
// fresh). Before, the acquire's update of a lapsed holder scanned every
// ACTIVE session and evaluated the (not inlinable) liveness function on
// each: O(live sessions) on every acquire.
// openFresh opens a backend on a new migrated lockdb, closed with the test.
func openFresh(t *testing.T) (context.Context, *Backend) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	b, err := Open(ctx, Config{DatabaseURL: pgtest.NewDB(t, migrations.LockDB), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	return ctx, b
}

func TestHotPathCostIndependentOfLiveSessions(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	// Statistics taken while most sessions had ended, then thousands of
	// live sessions: the planner believes few sessions are ACTIVE.
	const others = 3000
	if _, err := b.pool.Exec(ctx, `INSERT INTO lock_session (owner, ttl_ms, expires_at, state)
		SELECT 'gone-' || i, 300000, now(), 'CLOSED' FROM generate_series(1, $1) i`, others); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `ANALYZE lock_session`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `INSERT INTO lock_session (owner, ttl_ms, expires_at)
		SELECT 'idle-' || i, 300000, now() + interval '5 minutes' FROM generate_series(1, $1) i`, others); err != nil {
		t.Fatal(err)
	}
	// Each of them holds a lock, with its grant.
	if _, err := b.pool.Exec(ctx, `
		WITH s AS (SELECT id, owner, nextval('lock_token_seq') AS token FROM lock_session WHERE owner LIKE 'idle-%'),
		     g AS (INSERT INTO lock_grant (token, key, owner, session_id) SELECT token, 'held:' || owner, owner, id FROM s)
		INSERT INTO lock_entry (key, owner, session_id, token) SELECT 'held:' || owner, owner, id, token FROM s`); err != nil {
		t.Fatal(err)
	}
	a, err := b.CreateSession(ctx, "a", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	holder, err := b.CreateSession(ctx, "holder", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	lapsed, err := b.CreateSession(ctx, "lapsed", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	held, err := b.Acquire(ctx, "plan:held", holder.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Acquire(ctx, "plan:lapsed", lapsed.ID); err != nil {
		t.Fatal(err)
	}
	mine, err := b.Acquire(ctx, "plan:mine", a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `UPDATE lock_session SET expires_at = now() - interval '1 second' WHERE id = $1`, lapsed.ID); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		sql  string
		args []any
	}{
		{"acquire free key", acquireSQL, []any{"plan:free", a.ID}},
		{"acquire free key, fast path", freeAcquireSQL, []any{[]string{"plan:free"}, []string{a.ID}}},
		{"acquire held key, fast path", freeAcquireSQL, []any{[]string{"plan:held"}, []string{a.ID}}},
		{"acquire 4 keys, fast path", freeAcquireSQL, []any{
			[]string{"plan:free", "plan:held", "plan:lapsed", "plan:free2"}, []string{a.ID, a.ID, holder.ID, lapsed.ID}}},
		{"acquire held key", acquireSQL, []any{"plan:held", a.ID}},
		{"acquire lapsed holder's key", acquireSQL, []any{"plan:lapsed", a.ID}},
		{"re-acquire own key", acquireSQL, []any{"plan:mine", a.ID}},
		{"release", releaseSQL, []any{[]string{"plan:mine"}, []string{a.ID}, []int64{int64(mine.Token)}}},
		{"release 3 keys", releaseSQL, []any{[]string{"plan:mine", "plan:held", "plan:free"},
			[]string{a.ID, holder.ID, a.ID}, []int64{int64(mine.Token), int64(held.Token), 1}}},
	}
	for _, stats := range []string{"skewed", "analyzed"} {
		if stats == "analyzed" {
			if _, err := b.pool.Exec(ctx, `ANALYZE lock_session, lock_entry, lock_grant`); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			for _, c := range cases {
				for _, table := range []string{"lock_session", "lock_entry", "lock_grant"} {
					if n := explainRowsRead(t, ctx, b, mode, table, c.sql, c.args...); n > 8 {
						t.Errorf("%s (%s statistics, %s): read %.0f %s rows with %d live sessions holding a lock each; want tens, by key, id or token (a plan that reads the table reads thousands)",
							c.name, stats, mode, n, table, others+3)
					}
				}
			}
		}
	}
}

// TestReapEndsGrantsByToken: the reaper ends a lapsed session's grants
// through the grant log's primary key, whatever the plan, reading a handful
// of lock_grant rows however long the log is.
func TestReapEndsGrantsByToken(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	if _, err := b.pool.Exec(ctx, `ANALYZE lock_session, lock_entry, lock_grant`); err != nil {
		t.Fatal(err)
	}
	const logged = 5000
	if _, err := b.pool.Exec(ctx, `INSERT INTO lock_grant (token, key, owner, session_id, granted_at, ended_at, end_reason, actor)
		SELECT nextval('lock_token_seq'), 'old:' || i, 'o', 'gone', now(), now(), 'released', 'o' FROM generate_series(1, $1) i`, logged); err != nil {
		t.Fatal(err)
	}
	s, err := b.CreateSession(ctx, "lapsing", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if _, err := b.Acquire(ctx, fmt.Sprintf("reap:%d", i), s.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.pool.Exec(ctx, `UPDATE lock_session SET expires_at = now() - interval '1 second' WHERE id = $1`, s.ID); err != nil {
		t.Fatal(err)
	}
	for _, stats := range []string{"stale", "analyzed"} {
		if stats == "analyzed" {
			if _, err := b.pool.Exec(ctx, `ANALYZE lock_session, lock_entry, lock_grant`); err != nil {
				t.Fatal(err)
			}
		}
		for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
			if n := explainRowsRead(t, ctx, b, mode, "lock_grant", reapSQL); n > 12 {
				t.Errorf("reaper (%s statistics, %s): read %.0f lock_grant rows to end 3 grants in a log of %d", stats, mode, n, logged+3)
			}
		}
	}
}

// pagesRead sums the pages the scans of table (or of its indexes) read.
func pagesRead(n planNode, table string) float64 {
	total := 0.0
	if n.Relation == table || strings.HasPrefix(n.Index, table) {
		total += n.SharedHit + n.SharedRead
	}
	for _, c := range n.Plans {
		total += pagesRead(c, table)
	}
	return total
}

// seqScans lists the tables a plan reads whole.
func seqScans(n planNode) []string {
	var out []string
	if n.NodeType == "Seq Scan" {
		out = append(out, n.Relation)
	}
	for _, c := range n.Plans {
		out = append(out, seqScans(c)...)
	}
	return out
}

// TestBatchPlansStayLookupsAsTheTablesGrow: a connection keeps the generic
// plan it made for each statement while lockdb was new and nearly empty;
// then sessions come and go, the grant log grows and lock_entry's heap
// fills with dead rows, as it does between vacuums under load. An acquire
// and a release must still read tens of pages, found by key, id or token.
// Before the statements set their plan settings, the release's plan read
// lock_entry whole, and under load throughput fell until a vacuum made
// PostgreSQL plan again.
func TestBatchPlansStayLookupsAsTheTablesGrow(t *testing.T) {
	t.Parallel()
	ctx, b := openFresh(t)
	s, err := b.CreateSession(ctx, "grown", "p", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := b.pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	// The worst a connection can keep: plans made for the tables as they
	// are now, kept whatever happens to them.
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	stmts := map[string]string{"acquire": freeAcquireSQL, "release": releaseSQL, "fullacq": acquireSQL}
	for name, sql := range stmts {
		if _, err := conn.Exec(ctx, `PREPARE `+name+` AS `+sql); err != nil {
			t.Fatal(err)
		}
	}
	inPlanTx := func(f func(tx pgx.Tx) error) {
		t.Helper()
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, planSettingsSQL); err != nil {
				return err
			}
			if err := f(tx); err != nil {
				return err
			}
			return errRollback
		})
		if err != errRollback {
			t.Fatal(err)
		}
	}
	inPlanTx(func(tx pgx.Tx) error {
		for _, q := range []string{`EXECUTE acquire('{}', '{}')`, `EXECUTE release('{}', '{}', '{}')`, `EXECUTE fullacq('none', 'none')`} {
			if _, err := tx.Exec(ctx, q); err != nil {
				return err
			}
		}
		return nil
	})
	// Sessions come and go, the grant log grows, and lock_entry's heap
	// fills with dead rows.
	if _, err := b.pool.Exec(ctx, `INSERT INTO lock_session (owner, ttl_ms, expires_at, state)
		SELECT 'gone-' || i, 300000, now(), 'CLOSED' FROM generate_series(1, 5000) i`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `
		WITH s AS (INSERT INTO lock_session (owner, ttl_ms, expires_at) VALUES ('old', 300000, now()) RETURNING id, owner),
		     g AS (INSERT INTO lock_grant (token, key, owner, session_id, granted_at, ended_at, end_reason, actor)
		           SELECT nextval('lock_token_seq'), 'old:' || i, s.owner, s.id, now(), now(), 'released', 'old'
		             FROM s, generate_series(1, 20000) i RETURNING token, key, owner, session_id)
		INSERT INTO lock_entry (key, owner, session_id, token) SELECT key, owner, session_id, token FROM g`); err != nil {
		t.Fatal(err)
	}
	if _, err := b.pool.Exec(ctx, `DELETE FROM lock_entry WHERE key LIKE 'old:%'`); err != nil {
		t.Fatal(err)
	}
	held, err := b.Acquire(ctx, "grown:held", s.ID)
	if err != nil {
		t.Fatal(err)
	}
	queries := map[string]string{
		"acquire": fmt.Sprintf(`EXECUTE acquire('{grown:free,grown:held}', '{%s,%s}')`, s.ID, s.ID),
		"release": fmt.Sprintf(`EXECUTE release('{grown:held,grown:free}', '{%s,%s}', '{%d,1}')`, s.ID, s.ID, held.Token),
		"fullacq": fmt.Sprintf(`EXECUTE fullacq('grown:held', '%s')`, s.ID),
	}
	for name, q := range queries {
		inPlanTx(func(tx pgx.Tx) error {
			var out []byte
			if err := tx.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+q).Scan(&out); err != nil {
				return err
			}
			var plans []struct {
				Plan planNode `json:"Plan"`
			}
			if err := json.Unmarshal(out, &plans); err != nil || len(plans) != 1 {
				t.Fatalf("EXPLAIN output %s: %v", out, err)
			}
			p := plans[0].Plan
			if seq := seqScans(p); len(seq) > 0 {
				t.Errorf("%s: reads %v whole with 20,000 grants and dead entries", name, seq)
			}
			for _, table := range []string{"lock_session", "lock_entry", "lock_grant"} {
				if n := pagesRead(p, table); n > 200 {
					t.Errorf("%s: read %.0f pages of %s (with its indexes) with 5,000 sessions, 20,000 grants and dead entries; want tens, by key, id or token (a plan that reads the table reads thousands)",
						name, n, table)
				}
			}
			return nil
		})
	}
}
