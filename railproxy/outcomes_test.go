package railproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// statementLog is a pgx tracer that keeps the SQL of every statement a pool
// sends, on its own or in a batch.
type statementLog struct {
	mu   sync.Mutex
	sqls []string
}

func (l *statementLog) add(sql string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sqls = append(l.sqls, sql)
}

// count is the number of statements sent since the last reset that contain s.
func (l *statementLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, q := range l.sqls {
		if strings.Contains(q, s) {
			n++
		}
	}
	return n
}

func (l *statementLog) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sqls = nil
}

func (l *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	l.add(d.SQL)
	return ctx
}

func (l *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (l *statementLog) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (l *statementLog) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	l.add(d.SQL)
}

func (l *statementLog) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// pool opens a pool on url whose statements l keeps.
func (l *statementLog) pool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = l
	pool, err := pgxpool.NewWithConfig(ctxFor(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func batchReqs(account string, token fencing.Token, payouts ...string) []proxyclient.SubmitRequest {
	out := make([]proxyclient.SubmitRequest, len(payouts))
	for i, p := range payouts {
		s := sub(p, account)
		out[i] = proxyclient.SubmitRequest{PayoutID: s.PayoutID, AccountID: s.AccountID, Token: token, Holder: holder(int(token)),
			ClientRef: s.ClientRef, Amount: s.Amount, Currency: s.Currency, BeneficiaryRef: s.BeneficiaryRef}
	}
	return out
}

// groupEnv is a proxydb with n forwarded submissions (ids) and no outcome,
// a store whose statements are logged, and a connection of its own.
type groupEnv struct {
	st    *store
	log   *statementLog
	check *pgx.Conn
	ids   []int64
}

func newGroupEnv(t *testing.T, n int) *groupEnv {
	t.Helper()
	url := pgtest.NewDB(t, migrations.ProxyDB)
	e := &groupEnv{log: &statementLog{}, check: pgtest.Conn(t, url)}
	e.st = newStore(e.log.pool(t, url), nil)
	payouts := make([]string, n)
	for i := range payouts {
		payouts[i] = fmt.Sprintf("p-%d", i)
	}
	recs, res, _, fenced, err := e.st.writeIntents(ctxFor(t), batchReqs("acc-g", 1, payouts...))
	if err != nil || fenced {
		t.Fatalf("intents: %v %v", fenced, err)
	}
	for i, r := range recs {
		if res[i] != intentWritten {
			t.Fatalf("intent %d not written", i)
		}
		e.ids = append(e.ids, r.ID)
	}
	e.log.reset()
	return e
}

type recorded struct {
	rec proxyclient.Record
	err error
}

// record records an outcome for id in the background.
func (e *groupEnv) record(t *testing.T, id int64, o proxyclient.Outcome, railRef, code string) <-chan recorded {
	ch := make(chan recorded, 1)
	ctx := ctxFor(t)
	go func() {
		rec, err := e.st.recordOutcome(ctx, id, o, railRef, code)
		ch <- recorded{rec, err}
	}()
	return ch
}

// holdFirstGroup starts recording ids[0]'s outcome while a transaction of
// the test holds its row, and returns once that outcome's group is being
// written (and blocked): the outcomes recorded from then on wait for the
// next group. release lets the first group finish and returns its result.
func (e *groupEnv) holdFirstGroup(t *testing.T) (release func() recorded) {
	t.Helper()
	ctx := ctxFor(t)
	tx, err := e.check.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM rail_submission WHERE id = $1 FOR UPDATE`, e.ids[0]); err != nil {
		t.Fatal(err)
	}
	first := e.record(t, e.ids[0], proxyclient.OutcomeAcked, "rr-first", "")
	eventually(t, "the first outcome is being written", func() (bool, error) {
		return e.st.outcomes.Writing() == 1 && e.st.outcomes.Waiting() == 0, nil
	})
	return func() recorded {
		t.Helper()
		if err := tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		r := <-first
		if r.err != nil || r.rec.ID != e.ids[0] || r.rec.RailRef != "rr-first" {
			t.Fatalf("first outcome: %+v %v", r.rec, r.err)
		}
		return r
	}
}

func (e *groupEnv) waitQueued(t *testing.T, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("%d outcomes wait for a group", n), func() (bool, error) {
		return e.st.outcomes.Waiting() == n, nil
	})
}

// Outcomes recorded while a group is being written are written together:
// N concurrent recordings take fewer than N statements, and each caller
// gets its own row back.
func TestConcurrentOutcomesWrittenInGroups(t *testing.T) {
	t.Parallel()
	const n = 20
	e := newGroupEnv(t, n+1)
	release := e.holdFirstGroup(t)
	waiting := make([]<-chan recorded, n)
	for i := range waiting {
		waiting[i] = e.record(t, e.ids[i+1], proxyclient.OutcomeAcked, fmt.Sprintf("rr-%d", i+1), "")
	}
	e.waitQueued(t, n)
	release()
	for i, ch := range waiting {
		r := <-ch
		if r.err != nil || r.rec.ID != e.ids[i+1] || r.rec.Outcome != proxyclient.OutcomeAcked ||
			r.rec.RailRef != fmt.Sprintf("rr-%d", i+1) || r.rec.OutcomeAt == nil {
			t.Fatalf("outcome %d: %+v %v", i+1, r.rec, r.err)
		}
	}
	if got := e.log.count("UPDATE rail_submission"); got != 2 {
		t.Fatalf("%d outcome statements for %d outcomes, want 2 (the first alone, then the rest together)", got, n+1)
	}
	var written int
	if err := e.check.QueryRow(ctxFor(t), `SELECT count(*) FROM rail_submission WHERE outcome = 'ACKED'`).Scan(&written); err != nil || written != n+1 {
		t.Fatalf("%d outcomes in proxydb (%v), want %d", written, err, n+1)
	}
	// Idle again: nothing waits and nothing is being written.
	eventually(t, "the groups to end", func() (bool, error) {
		return e.st.outcomes.Waiting() == 0 && e.st.outcomes.Writing() == 0, nil
	})
}

// In a group, an outcome already recorded is reported as such to its caller
// only (the first one stands); the others in the group are written. A
// second outcome for a submission in the same gathering waits for the next
// group and finds the first recorded.
func TestOutcomeGroupAlreadyRecordedToItsCallerOnly(t *testing.T) {
	t.Parallel()
	e := newGroupEnv(t, 4)
	ctx := ctxFor(t)
	x, y, z := e.ids[1], e.ids[2], e.ids[3]
	if _, err := e.check.Exec(ctx, `UPDATE rail_submission SET outcome = 'REJECTED', error_code = 'declined' WHERE id = $1`, x); err != nil {
		t.Fatal(err)
	}
	release := e.holdFirstGroup(t)
	cx := e.record(t, x, proxyclient.OutcomeAcked, "rr-x", "")
	cy1 := e.record(t, y, proxyclient.OutcomeAcked, "rr-y", "")
	cz := e.record(t, z, proxyclient.OutcomeTimeout, "", "rail_timeout")
	e.waitQueued(t, 3)
	cy2 := e.record(t, y, proxyclient.OutcomeTimeout, "", "rail_timeout")
	e.waitQueued(t, 4)
	release()

	if r := <-cx; !errors.Is(r.err, pgx.ErrNoRows) {
		t.Fatalf("already recorded outcome: %+v %v, want ErrNoRows", r.rec, r.err)
	}
	if r := <-cz; r.err != nil || r.rec.ID != z || r.rec.Outcome != proxyclient.OutcomeTimeout || r.rec.ErrorCode != "rail_timeout" {
		t.Fatalf("outcome of z: %+v %v", r.rec, r.err)
	}
	if r := <-cy1; r.err != nil || r.rec.ID != y || r.rec.Outcome != proxyclient.OutcomeAcked || r.rec.RailRef != "rr-y" {
		t.Fatalf("first outcome of y: %+v %v", r.rec, r.err)
	}
	if r := <-cy2; !errors.Is(r.err, pgx.ErrNoRows) {
		t.Fatalf("second outcome of y: %+v %v, want ErrNoRows", r.rec, r.err)
	}
	rows, err := e.check.Query(ctx, `SELECT id, outcome, coalesce(rail_ref, ''), coalesce(error_code, '') FROM rail_submission ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	want := map[int64]string{e.ids[0]: "ACKED rr-first ", x: "REJECTED  declined", y: "ACKED rr-y ", z: "TIMEOUT  rail_timeout"}
	got, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
		var (
			id                      int64
			outcome, ref, errorCode string
		)
		err := row.Scan(&id, &outcome, &ref, &errorCode)
		if s := outcome + " " + ref + " " + errorCode; err == nil && s != want[id] {
			return "", fmt.Errorf("row %d: %q, want %q", id, s, want[id])
		}
		return outcome, err
	})
	if err != nil || len(got) != 4 {
		t.Fatalf("rows: %v %v", got, err)
	}
	if n := e.log.count("UPDATE rail_submission"); n != 3 {
		t.Fatalf("%d groups written, want 3 (the first; x, y, z; y again)", n)
	}
}

// An error of a group's statement is every one of its callers' error;
// each can record again (forward's retry), in a new group.
func TestOutcomeGroupErrorReachesEveryCaller(t *testing.T) {
	t.Parallel()
	e := newGroupEnv(t, 3)
	release := e.holdFirstGroup(t)
	// The schema refuses a forwarded submission becoming FENCED: that one
	// fails the whole statement.
	bad := e.record(t, e.ids[1], proxyclient.OutcomeFenced, "", "fenced_out")
	good := e.record(t, e.ids[2], proxyclient.OutcomeAcked, "rr-2", "")
	e.waitQueued(t, 2)
	release()
	for name, ch := range map[string]<-chan recorded{"bad": bad, "good": good} {
		if r := <-ch; r.err == nil || errors.Is(r.err, pgx.ErrNoRows) || !strings.Contains(r.err.Error(), "cannot become FENCED") {
			t.Fatalf("%s caller: %+v %v, want the group's error", name, r.rec, r.err)
		}
	}
	rec, err := e.st.recordOutcome(ctxFor(t), e.ids[2], proxyclient.OutcomeAcked, "rr-2", "")
	if err != nil || rec.RailRef != "rr-2" {
		t.Fatalf("recorded again: %+v %v", rec, err)
	}
}

// A caller whose context ends while its outcome waits for a group gets its
// context's error; the outcome still goes out with the group (recording
// has no outside effect, and the rail has answered).
func TestOutcomeOfACallerGoneStillWritten(t *testing.T) {
	t.Parallel()
	e := newGroupEnv(t, 3)
	release := e.holdFirstGroup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	gone := make(chan error, 1)
	go func() {
		_, err := e.st.recordOutcome(ctx, e.ids[1], proxyclient.OutcomeAcked, "rr-1", "")
		gone <- err
	}()
	e.waitQueued(t, 1)
	stays := e.record(t, e.ids[2], proxyclient.OutcomeAcked, "rr-2", "")
	e.waitQueued(t, 2)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("caller gone: %v, want context.Canceled", err)
	}
	release()
	if r := <-stays; r.err != nil || r.rec.ID != e.ids[2] {
		t.Fatalf("remaining caller: %+v %v", r.rec, r.err)
	}
	e.st.outcomes.Wait()
	var ref string
	if err := e.check.QueryRow(ctxFor(t), `SELECT rail_ref FROM rail_submission WHERE id = $1 AND outcome = 'ACKED'`, e.ids[1]).Scan(&ref); err != nil || ref != "rr-1" {
		t.Fatalf("the outcome of the caller gone: %q %v, want ACKED rr-1", ref, err)
	}
}

// The group statement finds its rows through the primary key whatever the
// group's size, never by scanning the submissions without an outcome.
func TestOutcomeGroupPlan(t *testing.T) {
	t.Parallel()
	url := pgtest.NewDB(t, migrations.ProxyDB)
	conn := pgtest.Conn(t, url)
	ctx := ctxFor(t)
	if _, err := conn.Exec(ctx, `
		INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref)
		SELECT 'p-' || g, 'acc-' || g % 100, 1, 'h', 'po-' || g, 100, 'EUR', 'ben'
		  FROM generate_series(1, 20000) AS g;
		ANALYZE rail_submission`); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 16, maxOutcomeGroup} {
		ids, outcomes, refs, codes := make([]int64, n), make([]string, n), make([]*string, n), make([]*string, n)
		for i := range ids {
			ids[i], outcomes[i] = int64(5001+i), "ACKED"
		}
		rows, err := conn.Query(ctx, `EXPLAIN `+outcomeGroupSQL, ids, outcomes, refs, codes)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "rail_submission_pkey") {
			t.Fatalf("group of %d:\n%s\nwant rail_submission found through its primary key", n, plan)
		}
	}
}
