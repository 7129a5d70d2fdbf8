// Package pgpool is the one place a server's PostgreSQL connection pool is
// built, so every role runs with the same pool settings.
package pgpool

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Pool settings every server shares. A database URL may still override
// them with pool_* parameters (pool_max_conns=...).
const (
	DefaultMaxConns   = 16
	healthCheckPeriod = 15 * time.Second
	maxConnIdleTime   = 5 * time.Minute
	maxConnLifetime   = time.Hour
	connectTimeout    = 10 * time.Second
)

// PlanCacheMode is every pool's plan_cache_mode unless its URL sets one.
// Each statement is prepared once per connection; left to choose,
// PostgreSQL plans a statement over arrays afresh on every execution (the
// arrays' lengths make each custom plan look cheaper than the generic
// one), which cost paydb more CPU than running the payout creations did.
// Every hot statement is written for its generic plan, which the plan
// tests check (they plan with force_generic_plan).
const PlanCacheMode = "force_generic_plan"

// DurableCommits are the session settings of a pool whose commits must be
// on disk before they are answered, whatever the server's, database's or
// role's default: a guard's fence, a proxy's intent (lost in a crash, the
// payout it stood for would be sent to the rail again), a payout's state.
func DurableCommits() map[string]string { return map[string]string{"synchronous_commit": "on"} }

// Options adjust one pool.
type Options struct {
	// MaxConns bounds the pool; 0 keeps the URL's pool_max_conns, else
	// DefaultMaxConns.
	MaxConns int32
	// RuntimeParams are session settings every connection starts with
	// (e.g. synchronous_commit=on where a lost commit would reissue a token).
	RuntimeParams map[string]string
}

// New parses url and connects. what names the database in errors ("paydb").
func New(ctx context.Context, what, url string, o Options) (*pgxpool.Pool, error) {
	if url == "" {
		return nil, fmt.Errorf("%s: a database URL is required", what)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("%s: database URL: %w", what, err) // pgconn redacts the password
	}
	hasParam, err := urlParams(url)
	if err != nil {
		return nil, fmt.Errorf("%s: database URL: %w", what, err)
	}
	if !hasParam("pool_max_conns") {
		cfg.MaxConns = DefaultMaxConns
	}
	if o.MaxConns > 0 {
		cfg.MaxConns = o.MaxConns
	}
	if !hasParam("pool_health_check_period") {
		cfg.HealthCheckPeriod = healthCheckPeriod
	}
	if !hasParam("pool_max_conn_idle_time") {
		cfg.MaxConnIdleTime = maxConnIdleTime
	}
	if !hasParam("pool_max_conn_lifetime") {
		cfg.MaxConnLifetime = maxConnLifetime
	}
	if _, set := cfg.ConnConfig.RuntimeParams["plan_cache_mode"]; !set {
		cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = PlanCacheMode
	}
	for k, v := range o.RuntimeParams {
		cfg.ConnConfig.RuntimeParams[k] = v
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("%s: connect: %w", what, err)
	}
	return pool, nil
}

// urlParams says which pool settings the URL (or key = value string) sets,
// read as pgx reads it (a key = value string may have spaces around "="):
// pgconn passes the settings it does not know, the pool's among them, on
// as runtime parameters, which pgxpool then takes for itself.
func urlParams(url string) (func(name string) bool, error) {
	c, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	return func(name string) bool {
		_, set := c.RuntimeParams[name]
		return set
	}, nil
}
