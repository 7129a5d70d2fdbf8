package cmd

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/migrations"
)

// serverFlags are the flags every server role takes (DESIGN §4b).
type serverFlags struct {
	listen      string
	databaseURL string
	migrate     bool
	authFile    string
	insecure    bool
}

func (f *serverFlags) register(c *cobra.Command, defaultListen string, withDB bool) {
	c.Flags().StringVar(&f.listen, "listen", defaultListen, "address to listen on")
	if withDB {
		c.Flags().StringVar(&f.databaseURL, "database-url", "", "PostgreSQL URL of this role's database")
		c.Flags().BoolVar(&f.migrate, "migrate", false, "apply the embedded migrations at start")
	}
	c.Flags().StringVar(&f.authFile, "auth-file", "", `bearer tokens: {"tokens":[{"token":"...","role":"executor|reconciler|operator","name":"..."}]}`)
	c.Flags().BoolVar(&f.insecure, "insecure-no-auth", false, "accept every request without a token (local development only)")
}

// serverEnv is what a server role gets from its flags.
type serverEnv struct {
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Auth     *auth.Authenticator
}

// setup validates the common flags, builds the logger, registry and
// authenticator, and applies migrations when asked.
func (f *serverFlags) setup(cmd *cobra.Command, role string, db migrations.DB) (*serverEnv, error) {
	level, _ := cmd.Flags().GetString("log-level")
	logger := obs.NewLogger(cmd.ErrOrStderr(), obs.ParseLevel(level), role)
	a, err := auth.FromFlags(f.authFile, f.insecure)
	if err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	if f.insecure {
		logger.Warn("authentication is off (--insecure-no-auth): every caller is treated as an operator")
	}
	if db != "" {
		if f.databaseURL == "" {
			return nil, &ExitError{Code: 2, Err: fmt.Errorf("--database-url (or %s) is required", EnvName("database-url"))}
		}
		if f.migrate {
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			if err := migrations.Apply(ctx, db, f.databaseURL); err != nil {
				return nil, fmt.Errorf("migrate %s: %w", db, err)
			}
			logger.Info("migrations applied", "db", string(db))
		}
	}
	return &serverEnv{Logger: logger, Registry: obs.NewRegistry(), Auth: a}, nil
}

// clientFlags are the flags of every client role (DESIGN §4b).
type clientFlags struct {
	lockURL    string
	paymentURL string
	proxyURL   string
	railURL    string
	token      string
}

func (f *clientFlags) register(c *cobra.Command) {
	c.Flags().StringVar(&f.lockURL, "lock-url", "http://127.0.0.1:7101", "lock service URL")
	c.Flags().StringVar(&f.paymentURL, "payment-url", "http://127.0.0.1:7102", "payment resource URL")
	c.Flags().StringVar(&f.proxyURL, "proxy-url", "http://127.0.0.1:7103", "rail proxy URL")
	c.Flags().StringVar(&f.railURL, "rail-url", "http://127.0.0.1:7104", "rail URL (read-only checks)")
	c.Flags().StringVar(&f.token, "token", "", "bearer token for this caller's role")
}
