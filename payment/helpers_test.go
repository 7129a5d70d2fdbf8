package payment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind:", err)
			code = 1
		}
	}
	os.Exit(code)
}

const (
	executorBearer   = "executor-token-0123456789"
	reconcilerBearer = "reconciler-token-0123456789"
	operatorBearer   = "operator-token-0123456789"
	proxyBearer      = "proxy-token-0123456789"
)

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testBundle is a payment resource on a fresh paydb behind a real HTTP server,
// with a client per caller role.
type testBundle struct {
	svc   *Service
	reg   *prometheus.Registry
	logs  *syncBuffer
	url   string
	dbURL string
	exec  *pc.Client
	recon *pc.Client
	oper  *pc.Client
	proxy *pc.Client // the rail proxy's credential: valid, but for the rail only
}

// setup starts the bundle; opts adjust the service's configuration (the
// resolution SLA is a nanosecond unless an option sets it).
func setup(t testing.TB, opts ...func(*Config)) *testBundle {
	t.Helper()
	dbURL := pgtest.NewDB(t, migrations.PayDB)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logs := &syncBuffer{}
	logger := obs.NewLogger(logs, slog.LevelDebug, Role)
	reg := obs.NewRegistry()
	cfg := Config{DatabaseURL: dbURL, Logger: logger, Registry: reg, MaxConns: 8, ResolutionSLA: time.Nanosecond}
	for _, o := range opts {
		o(&cfg)
	}
	svc, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	a, err := auth.Parse([]byte(fmt.Sprintf(`{"tokens":[
		{"token":%q,"role":"executor","name":"exec-1"},
		{"token":%q,"role":"reconciler","name":"recon-1"},
		{"token":%q,"role":"operator","name":"alice"},
		{"token":%q,"role":"proxy","name":"proxy-1"}]}`, executorBearer, reconcilerBearer, operatorBearer, proxyBearer)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httpx.NewServer(httpx.Config{Role: Role, Logger: logger, Registry: reg, Auth: a})
	svc.Mount(srv.Router())
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	e := &testBundle{svc: svc, reg: reg, logs: logs, url: ts.URL, dbURL: dbURL}
	for _, c := range []struct {
		dst    **pc.Client
		bearer string
	}{{&e.exec, executorBearer}, {&e.recon, reconcilerBearer}, {&e.oper, operatorBearer}, {&e.proxy, proxyBearer}} {
		cl, err := pc.New(ts.URL, c.bearer, httpx.WithTimeout(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		*c.dst = cl
	}
	return e
}

// bg is the context of client calls in tests; every client call carries its
// own timeout (WithTimeout above).
var bg = context.Background()

// getStatus sends GET path with bearer and returns the answer's status.
func (e *testBundle) getStatus(t testing.TB, path, bearer string) int {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), http.MethodGet, e.url+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func (e *testBundle) account(t testing.TB, id string, opening int64) pc.Account {
	t.Helper()
	a, err := e.oper.CreateAccount(tctx(t), pc.CreateAccountRequest{ID: id, Currency: "EUR", OpeningBalance: opening})
	if err != nil {
		t.Fatalf("create account %s: %v", id, err)
	}
	return a
}

func (e *testBundle) payout(t testing.TB, id, account string, amount int64) pc.Payout {
	t.Helper()
	p, err := e.oper.CreatePayout(tctx(t), pc.CreatePayoutRequest{ID: id, AccountID: account, Amount: amount, Currency: "EUR", BeneficiaryRef: "ben-" + id})
	if err != nil {
		t.Fatalf("create payout %s: %v", id, err)
	}
	return p
}

// drive moves a fresh PENDING payout to state along the happy paths, every
// step under (token, holder).
// plantPayouts writes n payouts of account straight into paydb (ids
// po-00001 on, amount 1, EUR, submitted now), payout g (from 1) in the
// state stateOf(g), and analyzes the table: a history for the plan tests
// to read against, without driving each payout there.
func (e *testBundle) plantPayouts(t testing.TB, account string, n int, stateOf func(g int) pc.State) {
	t.Helper()
	ctx := tctx(t)
	states := make([]string, n)
	for g := 1; g <= n; g++ {
		states[g-1] = string(stateOf(g))
	}
	if _, err := e.svc.pool.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref, state, submitted_at)
		SELECT 'po-' || lpad(g::text, 5, '0'), $1, 1, 'EUR', 'b', 'po-po-' || g, st, now()
		  FROM unnest($2::text[]) WITH ORDINALITY AS u(st, g)`, account, states); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.pool.Exec(ctx, "ANALYZE payout"); err != nil {
		t.Fatal(err)
	}
}

func (e *testBundle) drive(t testing.TB, id string, state pc.State, token fencing.Token, holder fencing.Holder) pc.Payout {
	t.Helper()
	ctx := tctx(t)
	must := func(p pc.Payout, err error) pc.Payout {
		t.Helper()
		if err != nil {
			t.Fatalf("drive %s to %s: %v", id, state, err)
		}
		return p
	}
	p := must(e.exec.Payout(ctx, id))
	switch state {
	case pc.Pending:
		return p
	case pc.Abandoned:
		return must(e.oper.Cancel(ctx, id, token, holder, "test: not wanted"))
	}
	p = must(e.exec.Claim(ctx, id, token, holder))
	if state == pc.Claimed {
		return p
	}
	p = must(e.exec.Submitting(ctx, id, token, holder))
	switch state {
	case pc.RailSubmitted:
		return p
	case pc.Failed:
		return must(e.exec.ReportOutcome(ctx, id, token, holder, pc.OutcomeRejected, "", "DECLINED"))
	case pc.RailAmbiguous:
		return must(e.exec.ReportOutcome(ctx, id, token, holder, pc.OutcomeTimeout, "", ""))
	}
	p = must(e.exec.ReportOutcome(ctx, id, token, holder, pc.OutcomeAcked, "rail-"+id, ""))
	if state == pc.RailAcked {
		return p
	}
	p = must(e.exec.Post(ctx, id, token, holder))
	if state != pc.Posted {
		t.Fatalf("drive: unknown state %s", state)
	}
	return p
}

// counts returns the number of rows of every paydb table.
func (e *testBundle) counts(t testing.TB) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, tbl := range []string{"account", "payout", "ledger_entry", "payout_event", "safety_event"} {
		var n int64
		if err := e.svc.pool.QueryRow(tctx(t), "SELECT count(*) FROM "+tbl).Scan(&n); err != nil {
			t.Fatal(err)
		}
		out[tbl] = n
	}
	return out
}

// safetyKinds returns the kinds of safety events recorded for a payout.
func (e *testBundle) safetyKinds(t testing.TB, payoutID string) []string {
	t.Helper()
	rows, err := e.svc.pool.Query(tctx(t), `SELECT kind FROM safety_event WHERE payout_id = $1 ORDER BY id`, payoutID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			t.Fatal(err)
		}
		out = append(out, k)
	}
	return out
}

func (e *testBundle) eventCount(t testing.TB, payoutID string) int {
	t.Helper()
	var n int
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*) FROM payout_event WHERE payout_id = $1`, payoutID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// assertLedger checks INV-03 over the whole database and available >= 0
// for every customer account.
func (e *testBundle) assertLedger(t testing.TB) {
	t.Helper()
	rep, err := e.svc.CheckLedger(tctx(t), time.Time{}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Clean() {
		t.Fatalf("ledger drift: %+v", rep)
	}
	var n int
	if err := e.svc.pool.QueryRow(tctx(t), `SELECT count(*) FROM account a WHERE a.id NOT IN ('funding', 'payout-clearing')
		AND a.balance - COALESCE((SELECT sum(amount) FROM payout p WHERE p.account_id = a.id AND p.state = ANY($1)), 0) < 0`,
		heldStates).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("%d accounts have negative available funds", n)
	}
}

func wantCode(t testing.TB, err error, code problem.Code) *problem.Error {
	t.Helper()
	if !problem.Has(err, code) {
		t.Fatalf("want %s, got %v", code, err)
	}
	var pe *problem.Error
	_ = errors.As(err, &pe)
	return pe
}

func containsAll(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// counterValue reads a counter or gauge.
func counterValue(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

// timeZero makes CheckLedger check everything.
var timeZero time.Time

// genericPlans are the settings plan tests explain under: generic plans,
// as the pool's sessions make them (pgpool.PlanCacheMode), and no
// sequential scan an empty test table would otherwise get whatever the SQL.
var genericPlans = []string{"SET LOCAL plan_cache_mode = force_generic_plan", "SET LOCAL enable_seqscan = off"}

// prepared numbers the statements explainGeneric prepares.
var prepared atomic.Int64

// explainGeneric prepares sql and returns the plan of EXPLAIN opts
// EXECUTE of it with args (SQL literals), after the statements before.
func explainGeneric(t testing.TB, pool *pgxpool.Pool, opts, sql, args string, before ...string) string {
	t.Helper()
	name := fmt.Sprintf("explained_%d", prepared.Add(1))
	return explain(t, pool, opts, "EXECUTE "+name+"("+args+")", append(before, "PREPARE "+name+" AS "+sql)...)
}

// explain returns the plan of EXPLAIN opts stmt, run on one of the pool's
// sessions in a transaction rolled back afterwards, after the statements
// before (SET LOCAL settings, PREPAREs).
func explain(t testing.TB, pool *pgxpool.Pool, opts, stmt string, before ...string) string {
	t.Helper()
	ctx := tctx(t)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // read only
	for _, b := range before {
		if _, err := tx.Exec(ctx, b); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN "+opts+" "+stmt, pgx.QueryExecModeSimpleProtocol)
	if err != nil {
		t.Fatalf("explain %s: %v", stmt, err)
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return strings.Join(lines, "\n") + "\n"
}
