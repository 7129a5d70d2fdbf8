package cmd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/migrations"
)

// serverFlags are the flags every server role takes (DESIGN §4b).
type serverFlags struct {
	role        string
	db          migrations.DB // "" when the role has no database
	listen      string
	dbURL       databaseURL
	migrate     bool
	authFile    string
	insecure    bool
	tlsCert     string
	tlsKey      string
	tlsClientCA string
	pprof       pprofFlag
}

func (f *serverFlags) register(c *cobra.Command, role, defaultListen string, db migrations.DB) {
	f.role, f.db = role, db
	fl := c.Flags()
	fl.StringVar(&f.listen, "listen", defaultListen, "address to listen on")
	if db != "" {
		f.dbURL.register(c, "this role's database ("+string(db)+")")
		fl.BoolVar(&f.migrate, "migrate", false, "apply the embedded migrations at start")
	}
	fl.StringVar(&f.authFile, "auth-file", "", `bearer tokens, readable by the owner only: {"tokens":[{"token":"...","role":"executor|reconciler|operator|proxy","name":"..."}]}`)
	fl.BoolVar(&f.insecure, "insecure-no-auth", false, "accept every request without a token, as an operator (local development; loopback --listen only)")
	fl.StringVar(&f.tlsCert, "tls-cert-file", "", "serve HTTPS with this PEM certificate (chain); needs --tls-key-file")
	fl.StringVar(&f.tlsKey, "tls-key-file", "", "PEM private key of --tls-cert-file")
	fl.StringVar(&f.tlsClientCA, "tls-client-ca-file", "", "require every client to present a certificate signed by this PEM CA (mutual TLS)")
	f.pprof.register(c)
}

// serverEnv is what a server role gets from its flags.
type serverEnv struct {
	Logger      *slog.Logger
	Registry    *prometheus.Registry
	Auth        *auth.Authenticator
	TLS         *tls.Config // nil: plain HTTP
	DatabaseURL string
	pprof       string
	reloads     map[string]func() error // on SIGHUP
	// hup receives SIGHUP from setup on, for the life of the process: it
	// reloads while the server runs (one received before, during
	// migrations, as it starts) and is ignored once it drains; its default
	// action would end the server (mid-migration, or while it records its
	// last outcomes).
	hup <-chan os.Signal
}

// setup validates the common flags, builds the authenticator and the TLS
// configuration, runs the role's own checks (each returns a usage error)
// before the database is opened, and applies migrations when asked.
func (f *serverFlags) setup(cmd *cobra.Command, a *app, checks ...func() error) (*serverEnv, error) {
	usage := func(err error) error { return &ExitError{Code: 2, Err: err} }
	env := &serverEnv{Logger: a.logger(cmd, f.role), Registry: a.registry, pprof: f.pprof.addr, reloads: map[string]func() error{}}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	env.hup = hup
	if err := f.pprof.check(); err != nil {
		return nil, usage(err)
	}
	if f.insecure && !isLoopback(f.listen) {
		return nil, usage(fmt.Errorf("--insecure-no-auth is refused with --listen %s: without authentication a server may only listen on a loopback address (127.0.0.1:PORT, [::1]:PORT or localhost:PORT)", f.listen))
	}
	var err error
	if env.Auth, err = auth.FromFlags(f.authFile, f.insecure); err != nil {
		return nil, usage(err)
	}
	if f.authFile != "" {
		env.reloads["auth file "+f.authFile] = env.Auth.Reload
	}
	if f.insecure {
		env.Logger.Warn("authentication is off (--insecure-no-auth): every caller may call every route, as an operator and as every other role")
	}
	switch {
	case f.tlsCert != "" || f.tlsKey != "":
		st, err := httpx.NewServerTLS(f.tlsCert, f.tlsKey, f.tlsClientCA)
		if err != nil {
			return nil, usage(err)
		}
		env.TLS, env.reloads["TLS certificate "+f.tlsCert] = st.Config(), st.Reload
	case f.tlsClientCA != "":
		return nil, usage(errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file"))
	}
	for _, check := range checks {
		if err := check(); err != nil {
			return nil, err
		}
	}
	if f.db == "" {
		return env, nil
	}
	if env.DatabaseURL, err = f.dbURL.value(); err != nil {
		return nil, err
	}
	if err := waitForDatabase(cmd.Context(), env.Logger, f.db, env.DatabaseURL); err != nil {
		return nil, err
	}
	if f.migrate {
		ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
		defer cancel()
		if err := migrations.Apply(ctx, f.db, env.DatabaseURL, migrations.WithLogger(env.Logger)); err != nil {
			return nil, fmt.Errorf("migrate %s: %w", f.db, err)
		}
		env.Logger.Info("migrations applied", "db", string(f.db))
	}
	if err := checkSchema(cmd.Context(), env.Logger, f.db, env.DatabaseURL); err != nil {
		return nil, err
	}
	if err := checkRole(cmd.Context(), env, f.db); err != nil {
		return nil, err
	}
	return env, nil
}

// The wait at start for a database that accepts connections but does not
// answer them (a host whose PostgreSQL hangs, a proxy in front of a dead
// one): each attempt to connect gets dbAttemptTimeout, and a WARN line
// says the database does not answer yet, until dbWaitLimit has passed.
// Without it the first statement waited a minute (five with --migrate)
// without a word, then failed with "failed to receive message: timeout".
// Variables so the tests need not wait as long.
var (
	dbAttemptTimeout = 5 * time.Second
	dbWaitLimit      = 30 * time.Second
)

// waitForDatabase connects to db at url once before anything reads it. A
// database that refuses (nothing listens, authentication fails) is an
// error at once, as it was; one that does not answer is waited for up to
// dbWaitLimit, and is then an error naming it and where it was looked
// for (never the password).
func waitForDatabase(ctx context.Context, log *slog.Logger, db migrations.DB, url string) error {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("%s: database URL: %w", db, err) // pgconn redacts the password
	}
	where := databaseAddrs(cfg)
	start := time.Now()
	giveUp := start.Add(dbWaitLimit)
	for {
		until := time.Now().Add(dbAttemptTimeout)
		if until.After(giveUp) {
			until = giveUp
		}
		actx, cancel := context.WithDeadline(ctx, until)
		conn, err := pgconn.ConnectConfig(actx, cfg)
		timedOut := actx.Err() != nil
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case !timedOut:
			return fmt.Errorf("%s at %s: %w", db, where, err)
		case !time.Now().Before(giveUp):
			return fmt.Errorf("%s at %s did not answer within %v: check that its PostgreSQL is up and answering (pg_isready)", db, where, dbWaitLimit)
		}
		log.Warn("database does not answer yet", "db", string(db), "addr", where,
			"waited", time.Since(start).Round(time.Second).String(), "gives_up_after", dbWaitLimit.String())
	}
}

// databaseAddrs is where cfg looks for its database: host:port, each
// fallback after a comma.
func databaseAddrs(cfg *pgconn.Config) string {
	addrs := []string{net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))}
	for _, fb := range cfg.Fallbacks {
		a := net.JoinHostPort(fb.Host, strconv.Itoa(int(fb.Port)))
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	return strings.Join(addrs, ",")
}

// checkRole says, in the log and in payouts_database_role_privileged,
// whether the role this server uses could switch off its database's own
// defenses (a superuser, or the schema's owner: migrations.Privileged). It
// still serves: a development stack migrates and serves as one role.
func checkRole(ctx context.Context, env *serverEnv, db migrations.DB) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	priv, why, err := migrations.Privileged(ctx, env.DatabaseURL, "")
	if err != nil {
		return fmt.Errorf("%s: %w", db, err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "payouts_database_role_privileged",
		Help:        "1 when the role this server uses for its database could switch off the database's own defenses (a superuser, or the schema's owner); serve as a role with data privileges only (payouts migrate --grant-to).",
		ConstLabels: prometheus.Labels{"database": string(db)},
	})
	if priv {
		g.Set(1)
		env.Logger.Warn("the database role could switch off the database's own defenses (append-only and write-once triggers, the one-forwarded-submission index): serve as a role with data privileges only, granted by `payouts migrate --grant-to ROLE`",
			"db", string(db), "why", why)
	}
	return env.Registry.Register(g)
}

// checkSchema refuses to serve from a database whose schema is older than
// this binary's: its statements would fail on every call while the role
// reports ready. A newer schema (replicas of the previous release while an
// upgrade rolls out) is served, with a warning.
func checkSchema(ctx context.Context, log *slog.Logger, db migrations.DB, url string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	want, err := migrations.Latest(db)
	if err != nil {
		return err
	}
	have, err := migrations.Version(ctx, db, url)
	if err != nil {
		return fmt.Errorf("%s: read its schema version: %w", db, err)
	}
	switch {
	case have < want:
		return fmt.Errorf("%s is at schema version %d and this binary needs %d: run `payouts migrate --db %s` (or start with --migrate)", db, have, want, db)
	case have > want:
		log.Warn("the database's schema is newer than this binary's; serving it: finish upgrading every replica", "db", string(db), "schema_version", have, "binary_schema_version", want)
	}
	return nil
}

// run runs the role (and the pprof listener, when asked for) until ctx
// ends or one of them fails; SIGHUP re-reads the auth file and the TLS
// certificate and key.
func (e *serverEnv) run(ctx context.Context, role func(context.Context) error) error {
	if len(e.reloads) == 0 {
		return runWithPprof(ctx, e.pprof, e.Logger, role)
	}
	var g httpx.Group
	g.Add(func(ctx context.Context) error { return runWithPprof(ctx, e.pprof, e.Logger, role) })
	g.Add(func(ctx context.Context) error { return reloadOn(ctx, e.hup, e.Logger, e.reloads) })
	return g.Run(ctx)
}
