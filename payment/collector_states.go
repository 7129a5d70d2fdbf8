package payment

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// stateQueryTimeout bounds what a scrape waits for paydb: a slow paydb
// costs the scrape these series (and counts an error), never the whole
// /metrics.
const stateQueryTimeout = 2 * time.Second

// Payouts in a terminal state never leave it and are never deleted, so
// their count grows with the payouts ever made: counting them is a scan of
// history. A scrape therefore counts only the open states; the terminal
// ones are recounted when their count is older than terminalRecountEvery,
// by a recount that may run for terminalRecountTimeout. A scrape waits for
// that recount only as long as stateQueryTimeout allows; a longer one goes
// on in the background and serves the scrapes after it.
const (
	terminalRecountEvery   = time.Minute
	terminalRecountTimeout = time.Minute
)

// stateCollector reads the payouts per state, the age of the oldest payout
// in each state an executor moves, and the age of the oldest unresolved
// ambiguous payout from paydb when /metrics is scraped, so the numbers are
// exact whichever process or restart moved the payouts (counters of
// transitions cannot be: they restart at zero).
type stateCollector struct {
	pool                                          *pgxpool.Pool
	log                                           *slog.Logger
	sla                                           time.Duration
	byState, oldestOpen, oldestAmbiguous, slaDesc *prometheus.Desc
	errors                                        *prometheus.CounterVec

	// every is how old the terminal counts may be before a scrape has
	// them recounted (terminalRecountEvery; tests shorten it).
	every time.Duration
	// stop ends a running recount (the service's stop, before the pool
	// closes).
	stop context.Context

	// onRecount, when set (tests only), runs at the start of each recount.
	onRecount atomic.Pointer[func()]

	mu sync.Mutex
	// terminal holds the last terminal counts (nil: none read yet), read
	// at terminalAt; recounting, when not nil, is closed when the running
	// recount ends, having set recountErr.
	terminal   map[string]int64
	terminalAt time.Time
	recounting chan struct{}
	recountErr error
}

func newStateCollector(pool *pgxpool.Pool, log *slog.Logger, sla time.Duration, stop context.Context) *stateCollector {
	c := &stateCollector{
		pool: pool, log: log, sla: sla, every: terminalRecountEvery, stop: stop,
		byState: prometheus.NewDesc("payouts_payment_payouts",
			"Payouts in each state, read from paydb: the open states at scrape time, the terminal states (POSTED, FAILED, ABANDONED) recounted at most once a minute.", []string{"state"}, nil),
		oldestOpen: prometheus.NewDesc("payouts_payment_oldest_open_age_seconds",
			"Age (since it was created) of the oldest payout in each state an executor moves on its own (PENDING, CLAIMED, RAIL_SUBMITTED, RAIL_ACKED), read from paydb at scrape time; 0 when none is in it. Executors move a payout through these in seconds: one that stays for minutes means no executor is working, executors cannot reach a role they need (payment resource, proxy, lock service), or the rail is paused (alert PayoutsStuck).", []string{"state"}, nil),
		oldestAmbiguous: prometheus.NewDesc("payouts_payment_oldest_ambiguous_age_seconds",
			"Age of the oldest payout in RAIL_AMBIGUOUS (since it was submitted to the rail), read from paydb at scrape time; 0 when none is ambiguous.", nil, nil),
		slaDesc: prometheus.NewDesc("payouts_payment_resolution_sla_seconds",
			"The resolution SLA (--resolution-sla): an ambiguous payout older than this needs an operator, who may then abandon it.", nil, nil),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_payment_state_scrape_errors_total",
			Help: "Reads of payouts by state from paydb that failed or timed out, by read: open, a scrape's count of the open states (that scrape lacks payouts_payment_payouts, payouts_payment_oldest_open_age_seconds and payouts_payment_oldest_ambiguous_age_seconds; alert PayoutsStoreUnreachable); terminal, a recount of the terminal states (scrapes keep the previous terminal counts, or lack them while none was ever read; on a paydb of very many finished payouts it may fail where paydb is fine).",
		}, []string{"read"}),
	}
	for _, read := range []string{"open", "terminal"} {
		c.errors.WithLabelValues(read) // present at 0: increase() sees the first error
	}
	return c
}

// inList is states as an SQL list of literals: the planner then sees the
// states a query asks for (the open ones are few and read through
// payout_state_idx), which a parameter would hide from a generic plan.
func inList(terminal bool) string {
	var lits []string
	for _, s := range pc.States {
		if s.Terminal() == terminal {
			lits = append(lits, "'"+string(s)+"'")
		}
	}
	return "(" + strings.Join(lits, ", ") + ")"
}

// openStateQuery counts the payouts in each open state, the backlog, with
// the age of the oldest payout in each (since its creation), and finds the
// oldest ambiguous payout among the (few) RAIL_AMBIGUOUS rows only. That
// ambiguous age is measured as the reconciler's ambiguous_over_sla check
// measures it. It reads no terminal payout.
var openStateQuery = `SELECT state, count(*), EXTRACT(EPOCH FROM now() - min(created_at))::float8,
	COALESCE(EXTRACT(EPOCH FROM now() - (SELECT min(COALESCE(submitted_at, claimed_at, created_at))
		FROM payout WHERE state = '` + string(pc.RailAmbiguous) + `'))::float8, 0)
	FROM payout WHERE state IN ` + inList(false) + ` GROUP BY state`

// terminalStateQuery counts the payouts in each terminal state: a scan of
// every payout ever finished (index-only through payout_state_idx).
var terminalStateQuery = `SELECT state, count(*) FROM payout WHERE state IN ` + inList(true) + ` GROUP BY state`

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.byState
	ch <- c.oldestOpen
	ch <- c.oldestAmbiguous
	ch <- c.slaDesc
	c.errors.Describe(ch)
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.slaDesc, prometheus.GaugeValue, c.sla.Seconds())
	defer c.errors.Collect(ch)
	ctx, cancel := context.WithTimeout(c.stop, stateQueryTimeout)
	defer cancel()
	open, err := c.readOpen(ctx)
	if err != nil {
		c.errors.WithLabelValues("open").Inc()
		c.log.Warn("payouts by state could not be read for /metrics", slog.Any("error", err))
		return
	}
	terminal, err := c.terminalCounts(ctx)
	if err != nil {
		c.errors.WithLabelValues("terminal").Inc()
		c.log.Warn("payouts in terminal states could not be recounted for /metrics; the previous counts stand", slog.Any("error", err))
	}
	// Every state, zeros included: a state that empties drops to 0
	// rather than vanishing from the graphs. Terminal states are left out
	// only while no count of them was ever read.
	for _, s := range pc.States {
		n := open.counts[string(s)]
		if s.Terminal() {
			if terminal == nil {
				continue
			}
			n = terminal[string(s)]
		}
		ch <- prometheus.MustNewConstMetric(c.byState, prometheus.GaugeValue, float64(n), string(s))
	}
	// The states an executor moves on its own, zeros included: an age
	// that is 0 rather than absent when the state empties, so an alert on
	// it resolves.
	for _, s := range pc.States {
		if s.Actionable() {
			ch <- prometheus.MustNewConstMetric(c.oldestOpen, prometheus.GaugeValue, open.oldest[string(s)], string(s))
		}
	}
	ch <- prometheus.MustNewConstMetric(c.oldestAmbiguous, prometheus.GaugeValue, open.oldestAmbiguous)
}

// openRead is what openStateQuery reads: per open state, its payouts and
// the age in seconds of its oldest one (since created_at); and the age of
// the oldest ambiguous payout (0 when none).
type openRead struct {
	counts          map[string]int64
	oldest          map[string]float64
	oldestAmbiguous float64
}

// readOpen runs openStateQuery. No age is reported negative (as a step
// back of the database host's clock could make it).
func (c *stateCollector) readOpen(ctx context.Context) (openRead, error) {
	r := openRead{counts: map[string]int64{}, oldest: map[string]float64{}}
	rows, err := c.pool.Query(ctx, openStateQuery)
	if err != nil {
		return r, err
	}
	defer rows.Close()
	for rows.Next() {
		var state string
		var n int64
		var age, ambiguous float64
		if err := rows.Scan(&state, &n, &age, &ambiguous); err != nil {
			return r, err
		}
		r.counts[state], r.oldest[state], r.oldestAmbiguous = n, max(age, 0), max(ambiguous, 0)
	}
	return r, rows.Err()
}

// count runs a query of (state, count) rows.
func (c *stateCollector) count(ctx context.Context, sql string) (map[string]int64, error) {
	rows, err := c.pool.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	counts := map[string]int64{}
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n); err != nil {
			return nil, err
		}
		counts[state] = n
	}
	return counts, rows.Err()
}

// terminalCounts returns the terminal counts to report: the last ones read,
// after a recount when they are older than c.every. It waits for the
// recount until ctx ends, then returns what it has (nil if nothing was
// ever read) and, if the recount failed, its error.
func (c *stateCollector) terminalCounts(ctx context.Context) (map[string]int64, error) {
	c.mu.Lock()
	if c.terminal != nil && time.Since(c.terminalAt) < c.every {
		defer c.mu.Unlock()
		return c.terminal, nil
	}
	done := c.recounting
	if done == nil {
		done = make(chan struct{})
		c.recounting = done
		go c.recount(done)
	}
	c.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-done:
		return c.terminal, c.recountErr
	default:
		if c.terminal == nil {
			return nil, fmt.Errorf("the recount of terminal states is still running after %s", stateQueryTimeout)
		}
		return c.terminal, nil // stale while the recount goes on
	}
}

// recount runs terminalStateQuery and closes done.
func (c *stateCollector) recount(done chan struct{}) {
	ctx, cancel := context.WithTimeout(c.stop, terminalRecountTimeout)
	defer cancel()
	start := time.Now()
	if f := c.onRecount.Load(); f != nil {
		(*f)()
	}
	counts, err := c.count(ctx, terminalStateQuery)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.recountErr = err
	if err == nil {
		c.terminal, c.terminalAt = counts, start
	}
	c.recounting = nil
	close(done)
}
