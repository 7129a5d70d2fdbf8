package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/payouts/payouts/internal/httpx"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
)

// BaselineRiver is `bench e2e --baseline river`: the same work (hold the
// funds, pay at the rail stub, post two ledger lines) done the way a team
// would without fencing: a River job queue on the same PostgreSQL, workers
// in one process, no lock service, no guards, no proxy. It is the yardstick
// payouts is measured against on the machine at hand, in the same run.
const BaselineRiver = "river"

// DefaultRiverWorkers is the baseline's River workers unless
// --baseline-workers says otherwise. A River producer fetches at most as many jobs as it has
// idle workers, at most once per FetchCooldown (100 ms by default): 8
// workers cap the queue at 80 jobs/s and 32 at 320 whatever the machine,
// so the baseline runs with the 100 workers River's own examples use (on
// two cores 200 did no better; docs/benchmarks-history.md).
const DefaultRiverWorkers = 100

// riverDB is the baseline's database, on the stack's PostgreSQL cluster.
const riverDB = "riverdb"

// riverSchema is the baseline's own tables: an account with its balance
// and the funds held for payouts in flight, the payout, and the ledger.
const riverSchema = `
CREATE TABLE IF NOT EXISTS account (
	id       text PRIMARY KEY,
	currency text NOT NULL,
	balance  bigint NOT NULL CHECK (balance >= 0),
	held     bigint NOT NULL DEFAULT 0 CHECK (held >= 0)
);
CREATE TABLE IF NOT EXISTS payout (
	id              text PRIMARY KEY,
	account_id      text NOT NULL REFERENCES account (id),
	amount          bigint NOT NULL CHECK (amount > 0),
	currency        text NOT NULL,
	beneficiary_ref text NOT NULL,
	client_ref      text NOT NULL UNIQUE,
	state           text NOT NULL DEFAULT 'PENDING',
	rail_ref        text,
	created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
	ended_at        timestamptz
);
CREATE TABLE IF NOT EXISTS ledger_entry (
	id         bigserial PRIMARY KEY,
	account_id text NOT NULL REFERENCES account (id),
	amount     bigint NOT NULL CHECK (amount <> 0),
	payout_id  text NOT NULL REFERENCES payout (id),
	created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS ledger_entry_account_idx ON ledger_entry (account_id, id);
INSERT INTO account (id, currency, balance) VALUES ('payout-clearing', 'EUR', 0) ON CONFLICT DO NOTHING;
`

// riverPayoutArgs is the job: pay out one payout.
type riverPayoutArgs struct {
	PayoutID string `json:"payout_id"`
}

// Kind implements river.JobArgs.
func (riverPayoutArgs) Kind() string { return "payout" }

// riverWorker does one payout: hold the funds, pay at the rail, post the
// ledger lines and release the hold. A retried job whose payout was already
// submitted pays again: River runs a job at least once, which is what
// fencing is for.
type riverWorker struct {
	river.WorkerDefaults[riverPayoutArgs]
	pool *pgxpool.Pool
	rail *railclient.Client
	done *atomic.Int64
	errs *atomic.Int64
	log  *slog.Logger
}

func (w *riverWorker) Work(ctx context.Context, job *river.Job[riverPayoutArgs]) error {
	err := w.work(ctx, job.Args.PayoutID)
	if err != nil {
		w.errs.Add(1)
		w.log.Warn("river baseline: payout job failed; River retries it", "payout_id", job.Args.PayoutID, "error", err.Error())
	}
	return err
}

func (w *riverWorker) work(ctx context.Context, id string) error {
	var (
		accountID, currency, beneficiary, clientRef, state string
		amount                                             int64
	)
	// Hold: the payout moves to SUBMITTING and its amount from the balance
	// to the held funds, in one transaction.
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		if err := tx.QueryRow(ctx, `SELECT account_id, amount, currency, beneficiary_ref, client_ref, state FROM payout WHERE id = $1 FOR UPDATE`, id).
			Scan(&accountID, &amount, &currency, &beneficiary, &clientRef, &state); err != nil {
			return err
		}
		if state != "PENDING" {
			return nil
		}
		tag, err := tx.Exec(ctx, `UPDATE account SET balance = balance - $2, held = held + $2 WHERE id = $1 AND balance >= $2`, accountID, amount)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			state = "FAILED"
			_, err := tx.Exec(ctx, `UPDATE payout SET state = 'FAILED', ended_at = clock_timestamp() WHERE id = $1`, id)
			return err
		}
		state = "SUBMITTING"
		_, err = tx.Exec(ctx, `UPDATE payout SET state = 'SUBMITTING' WHERE id = $1`, id)
		return err
	})
	if err != nil {
		return fmt.Errorf("hold: %w", err)
	}
	if state != "SUBMITTING" {
		w.done.Add(1) // finished (by an earlier run of the job, or for want of funds)
		return nil
	}
	pay, err := w.rail.Pay(ctx, railclient.PaymentRequest{ClientRef: clientRef, Amount: amount, Currency: currency, BeneficiaryRef: beneficiary})
	if err != nil {
		return fmt.Errorf("pay at the rail: %w", err)
	}
	// Post: two ledger lines, the hold released, the payout final.
	b := &pgx.Batch{}
	if pay.Status == "settled" {
		b.Queue(`UPDATE account SET held = held - $2 WHERE id = $1`, accountID, amount)
		b.Queue(`INSERT INTO ledger_entry (account_id, amount, payout_id) VALUES ($1, -$2::bigint, $3), ('payout-clearing', $2, $3)`, accountID, amount, id)
		b.Queue(`UPDATE payout SET state = 'POSTED', rail_ref = $2, ended_at = clock_timestamp() WHERE id = $1`, id, pay.RailRef)
	} else {
		b.Queue(`UPDATE account SET held = held - $2, balance = balance + $2 WHERE id = $1`, accountID, amount)
		b.Queue(`UPDATE payout SET state = 'FAILED', rail_ref = $2, ended_at = clock_timestamp() WHERE id = $1`, id, pay.RailRef)
	}
	if err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error { return tx.SendBatch(ctx, b).Close() }); err != nil {
		return fmt.Errorf("post: %w", err)
	}
	w.done.Add(1)
	return nil
}

// runRiverBaseline runs the baseline on the stack's PostgreSQL and rail
// stub: accounts and payouts as the payouts run has them, each payout
// created through the baseline's HTTP API with its job in one transaction,
// River's workers (--baseline-workers of them) in this process. Its CPU
// figures are this process's, PostgreSQL's and the rail stub's: the
// payouts roles started for the run after it sit idle meanwhile.
func runRiverBaseline(ctx context.Context, o E2EOptions, sys *e2eSystem) (E2EResult, error) {
	log := o.Logger
	pg := sys.st.PG()
	if err := pg.CreateDatabase(ctx, riverDB, ""); err != nil {
		return E2EResult{}, fmt.Errorf("create %s: %w", riverDB, err)
	}
	cfg, err := pgxpool.ParseConfig(pg.URL(riverDB))
	if err != nil {
		return E2EResult{}, err
	}
	// Every worker and loader has a connection, and River its own few.
	cfg.MaxConns = int32(o.BaselineWorkers + o.LoadWorkers + 8)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return E2EResult{}, err
	}
	defer pool.Close()
	driver := riverpgxv5.New(pool)
	migrator, err := rivermigrate.New(driver, nil)
	if err != nil {
		return E2EResult{}, err
	}
	if _, err := migrator.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return E2EResult{}, fmt.Errorf("river migrations: %w", err)
	}
	if _, err := pool.Exec(ctx, riverSchema); err != nil {
		return E2EResult{}, fmt.Errorf("baseline schema: %w", err)
	}

	// The workers pay with the credential the rail proxy uses.
	rail, err := railclient.New(sys.railURL, sys.st.Ready.Tokens.Proxy, httpx.WithTimeout(time.Minute))
	if err != nil {
		return E2EResult{}, err
	}
	opRail, ms, err := sys.operatorRail(ctx, o)
	if err != nil {
		return E2EResult{}, err
	}

	var done, errs atomic.Int64
	workers := river.NewWorkers()
	river.AddWorker(workers, &riverWorker{pool: pool, rail: rail, done: &done, errs: &errs, log: log})
	client, err := river.NewClient(driver, &river.Config{
		Queues:  map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: o.BaselineWorkers}},
		Workers: workers,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		return E2EResult{}, err
	}
	run := "river" + strconv.FormatInt(time.Now().UnixNano()/1e6, 36)
	log.Info("loading accounts", "accounts", o.Accounts)
	perAccount := int64((o.Payouts+o.Accounts-1)/o.Accounts) * e2eAmount
	rows := make([][]any, o.Accounts)
	for i := range rows {
		rows[i] = []any{e2eAccountID(run, i), "EUR", perAccount * 2}
	}
	if _, err := pool.CopyFrom(ctx, pgx.Identifier{"account"}, []string{"id", "currency", "balance"}, pgx.CopyFromRows(rows)); err != nil {
		return E2EResult{}, fmt.Errorf("load accounts: %w", err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE"); err != nil {
		return E2EResult{}, err
	}
	if err := client.Start(ctx); err != nil {
		return E2EResult{}, fmt.Errorf("start river: %w", err)
	}
	var stopOnce sync.Once
	stopClient := func() {
		stopOnce.Do(func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := client.Stop(sctx); err != nil {
				log.Warn("stopping river", "error", err.Error())
			}
		})
	}
	defer stopClient()
	api, err := startRiverAPI(pool, client)
	if err != nil {
		return E2EResult{}, err
	}
	defer api.close()
	if err := sys.cpu.start(); err != nil {
		return E2EResult{}, err
	}
	log.Info("creating payouts", "payouts", o.Payouts, "offered_rate", o.Rate, "baseline", BaselineRiver)
	start := time.Now()
	loadErr, stopLoad := startLoad(ctx, o, run, start, func(ctx context.Context, _ int, p pc.CreatePayoutRequest) error {
		return api.create(ctx, riverCreate(p))
	})
	defer stopLoad()
	// The workers count what they finish: nothing to read from outside.
	if err := sys.waitFor(ctx, o, loadErr, 50*time.Millisecond, func(context.Context) (int, error) {
		return int(done.Load()), nil
	}); err != nil {
		return E2EResult{}, err
	}
	cpu, err := sys.cpu.since()
	if err != nil {
		return E2EResult{}, err
	}
	loadavg := loadAvg()
	stopClient()

	res := E2EResult{
		Payouts: o.Payouts, Accounts: o.Accounts, Concurrency: o.BaselineWorkers, Baseline: BaselineRiver,
		RailLatencyMs: ms, OfferedRate: o.Rate, LoadAvg: loadavg, CPUPer1000: map[string]float64{},
	}
	for _, name := range []string{"bench", "postgres", "rail"} {
		if d, ok := cpu[name]; ok {
			res.CPUPer1000[name] = round3(d.Seconds() * 1000 / float64(o.Payouts))
		}
	}
	spans := make([]span, 0, o.Payouts)
	prows, err := pool.Query(ctx, `SELECT state, created_at, ended_at FROM payout WHERE id LIKE $1 || '-p%'`, run)
	if err != nil {
		return res, err
	}
	for prows.Next() {
		var (
			state   string
			created time.Time
			ended   *time.Time
		)
		if err := prows.Scan(&state, &created, &ended); err != nil {
			prows.Close()
			return res, err
		}
		switch {
		case state == "POSTED" && ended != nil:
			res.Posted++
		case state == "FAILED" && ended != nil:
			res.Failed++
		default:
			prows.Close()
			return res, fmt.Errorf("a payout is %s after the run", state)
		}
		spans = append(spans, span{created: created, ended: *ended})
	}
	prows.Close()
	if err := prows.Err(); err != nil {
		return res, err
	}
	if len(spans) != o.Payouts {
		return res, fmt.Errorf("found %d of the run's %d payouts", len(spans), o.Payouts)
	}
	// The work was done: two ledger lines per posted payout, summing to
	// zero, and no funds left held.
	var lines, held, sum int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM ledger_entry WHERE payout_id LIKE $1 || '-p%'),
	       (SELECT COALESCE(sum(held), 0) FROM account), (SELECT COALESCE(sum(amount), 0) FROM ledger_entry)`, run).Scan(&lines, &held, &sum); err != nil {
		return res, err
	}
	if lines != 2*int64(res.Posted) || held != 0 || sum != 0 {
		return res, fmt.Errorf("baseline ledger: %d lines for %d posted payouts, %d held, lines sum to %d", lines, res.Posted, held, sum)
	}
	summarize(spans, &res)
	res.PayoutsPerSec = round3(float64(o.Payouts) / res.Seconds)
	if res.Duplicates, err = railDuplicates(ctx, opRail, "river-"+run+"-"); err != nil {
		return res, err
	}
	if n := errs.Load(); n > 0 {
		return res, fmt.Errorf("%d payout jobs failed and were retried; see the log", n)
	}
	return res, nil
}

// riverCreate is the baseline API's create request: the fields of the
// payment resource's.
type riverCreate pc.CreatePayoutRequest

// riverAPI is the baseline's payout service: POST /v1/payouts creates the
// payout and its job in one transaction, over HTTP on loopback as payouts'
// creates are, so that both sides pay for a create request.
type riverAPI struct {
	srv    *http.Server
	url    string
	client *http.Client
}

func startRiverAPI(pool *pgxpool.Pool, rc *river.Client[pgx.Tx]) (*riverAPI, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/payouts", func(w http.ResponseWriter, r *http.Request) {
		var req riverCreate
		if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16)).Decode(&req); err != nil || req.ID == "" || req.AccountID == "" || req.Amount <= 0 {
			http.Error(w, "bad payout request", http.StatusBadRequest)
			return
		}
		ctx := r.Context()
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO payout (id, account_id, amount, currency, beneficiary_ref, client_ref) VALUES ($1, $2, $3, $4, $5, $6)`,
				req.ID, req.AccountID, req.Amount, req.Currency, req.BeneficiaryRef, "river-"+req.ID); err != nil {
				return err
			}
			_, err := rc.InsertTx(ctx, tx, riverPayoutArgs{PayoutID: req.ID}, nil)
			return err
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(map[string]string{"id": req.ID, "state": "PENDING"})
	})
	a := &riverAPI{
		srv:    &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second},
		url:    "http://" + ln.Addr().String() + "/v1/payouts",
		client: httpx.NewHTTPClient(nil),
	}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

func (a *riverAPI) create(ctx context.Context, c riverCreate) error {
	body, err := json.Marshal(c)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, a.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode != http.StatusCreated {
		return fmt.Errorf("create payout %s: %s: %s", c.ID, resp.Status, bytes.TrimSpace(b))
	}
	return nil
}

func (a *riverAPI) close() {
	_ = a.srv.Close()
	a.client.CloseIdleConnections()
}

// startLoad creates run's payouts with o.LoadWorkers loaders, payout i
// due at o.Rate from start, through create; the channel receives the
// loaders' first error (or nil) when they are done.
func startLoad(ctx context.Context, o E2EOptions, run string, start time.Time, create func(ctx context.Context, i int, p pc.CreatePayoutRequest) error) (<-chan error, context.CancelFunc) {
	loadErr := make(chan error, 1)
	lctx, stop := context.WithCancel(ctx)
	go func() {
		loadErr <- parallel(lctx, o.Payouts, o.LoadWorkers, func(ctx context.Context, i int) error {
			if err := pace(ctx, start, o.Rate, i); err != nil {
				return err
			}
			return create(ctx, i, pc.CreatePayoutRequest{
				ID: e2ePayoutID(run, i), AccountID: e2eAccountID(run, i%o.Accounts), Amount: e2eAmount,
				Currency: "EUR", BeneficiaryRef: "bench-beneficiary-" + strconv.Itoa(i%97),
			})
		})
	}()
	return loadErr, stop
}

// pace waits until payout i is due at the offered rate (0: at once).
func pace(ctx context.Context, start time.Time, rate float64, i int) error {
	if rate <= 0 {
		return nil
	}
	d := time.Until(start.Add(time.Duration(float64(i) / rate * float64(time.Second))))
	if d <= 0 {
		return nil
	}
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
