package payment

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// stateQueryTimeout bounds the query a scrape runs: a slow paydb costs the
// scrape these series (and counts an error), never the whole /metrics.
const stateQueryTimeout = 2 * time.Second

// stateCollector reads the payouts per state and the age of the oldest
// unresolved ambiguous payout from paydb when /metrics is scraped, so the
// numbers are exact whichever process or restart moved the payouts
// (counters of transitions cannot be: they restart at zero).
type stateCollector struct {
	pool                              *pgxpool.Pool
	log                               *slog.Logger
	sla                               time.Duration
	byState, oldestAmbiguous, slaDesc *prometheus.Desc
	errors                            prometheus.Counter
}

func newStateCollector(pool *pgxpool.Pool, log *slog.Logger, sla time.Duration) *stateCollector {
	return &stateCollector{
		pool: pool, log: log, sla: sla,
		byState: prometheus.NewDesc("payouts_payment_payouts",
			"Payouts in each state, read from paydb at scrape time.", []string{"state"}, nil),
		oldestAmbiguous: prometheus.NewDesc("payouts_payment_oldest_ambiguous_age_seconds",
			"Age of the oldest payout in RAIL_AMBIGUOUS (since it was submitted to the rail), read from paydb at scrape time; 0 when none is ambiguous.", nil, nil),
		slaDesc: prometheus.NewDesc("payouts_payment_resolution_sla_seconds",
			"The resolution SLA (--resolution-sla): an ambiguous payout older than this needs an operator, who may then abandon it.", nil, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "payouts_payment_state_scrape_errors_total",
			Help: "Scrapes whose paydb query for payouts by state failed or timed out; those scrapes lack payouts_payment_payouts and payouts_payment_oldest_ambiguous_age_seconds.",
		}),
	}
}

// stateQuery is one statement: the count per state can be answered from
// payout_state_idx, and the oldest ambiguous payout is looked up through
// the same index among the (few) RAIL_AMBIGUOUS rows only. The age is
// measured as the reconciler's ambiguous_over_sla check measures it.
const stateQuery = `SELECT state, count(*),
	COALESCE(EXTRACT(EPOCH FROM now() - (SELECT min(COALESCE(submitted_at, claimed_at, created_at))
		FROM payout WHERE state = $1))::float8, 0)
	FROM payout GROUP BY state`

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.byState
	ch <- c.oldestAmbiguous
	ch <- c.slaDesc
	c.errors.Describe(ch)
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.slaDesc, prometheus.GaugeValue, c.sla.Seconds())
	counts, oldest, err := c.read()
	if err != nil {
		c.errors.Inc()
		c.log.Warn("payouts by state could not be read for /metrics", slog.Any("error", err))
	} else {
		// Every state, zeros included: a state that empties drops to 0
		// rather than vanishing from the graphs.
		for _, s := range pc.States {
			ch <- prometheus.MustNewConstMetric(c.byState, prometheus.GaugeValue, float64(counts[string(s)]), string(s))
		}
		ch <- prometheus.MustNewConstMetric(c.oldestAmbiguous, prometheus.GaugeValue, oldest)
	}
	c.errors.Collect(ch)
}

// read runs stateQuery under stateQueryTimeout.
func (c *stateCollector) read() (map[string]int64, float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stateQueryTimeout)
	defer cancel()
	rows, err := c.pool.Query(ctx, stateQuery, string(pc.RailAmbiguous))
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	counts := map[string]int64{}
	var oldest float64
	for rows.Next() {
		var state string
		var n int64
		if err := rows.Scan(&state, &n, &oldest); err != nil {
			return nil, 0, err
		}
		counts[state] = n
	}
	return counts, max(oldest, 0), rows.Err()
}
