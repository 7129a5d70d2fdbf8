package cmd

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/migrations"
)

// serverFlags are the flags every server role takes (DESIGN §4b).
type serverFlags struct {
	role     string
	db       migrations.DB // "" when the role has no database
	listen   string
	dbURL    databaseURL
	migrate  bool
	authFile string
	insecure bool
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
}

// serverEnv is what a server role gets from its flags.
type serverEnv struct {
	Logger      *slog.Logger
	Registry    *prometheus.Registry
	Auth        *auth.Authenticator
	DatabaseURL string
}

// setup validates the common flags, builds the authenticator and applies
// migrations when asked.
func (f *serverFlags) setup(cmd *cobra.Command, a *app) (*serverEnv, error) {
	env := &serverEnv{Logger: a.logger(cmd, f.role), Registry: a.registry}
	var err error
	if env.Auth, err = auth.FromFlags(f.authFile, f.insecure); err != nil {
		return nil, &ExitError{Code: 2, Err: err}
	}
	if f.insecure {
		env.Logger.Warn("authentication is off (--insecure-no-auth): every caller is treated as an operator")
	}
	if f.db == "" {
		return env, nil
	}
	if env.DatabaseURL, err = f.dbURL.value(); err != nil {
		return nil, err
	}
	if f.migrate {
		ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
		defer cancel()
		if err := migrations.Apply(ctx, f.db, env.DatabaseURL); err != nil {
			return nil, fmt.Errorf("migrate %s: %w", f.db, err)
		}
		env.Logger.Info("migrations applied", "db", string(f.db))
	}
	return env, nil
}
