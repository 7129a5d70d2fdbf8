package cmd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/migrations"
)

func newMigrateCmd(a *app) *cobra.Command {
	var (
		db          string
		dbURL       databaseURL
		out         output
		timeout     time.Duration
		lockTimeout time.Duration
		grantTo     string
	)
	c := &cobra.Command{
		Use:   "migrate --db paydb|proxydb|lockdb",
		Short: "Apply the embedded schema migrations to paydb, proxydb or lockdb (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := migrations.Parse(db)
			if err != nil {
				var names []string
				for _, d := range migrations.All() {
					names = append(names, string(d))
				}
				valid := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
				if db == "" {
					return &ExitError{Code: 2, Err: fmt.Errorf("--db is required: %s", valid)}
				}
				return &ExitError{Code: 2, Err: fmt.Errorf("--db must be %s, got %q", valid, db)}
			}
			url, err := dbURL.value()
			if err != nil {
				return err
			}
			if grantTo != "" {
				if err := migrations.CheckRoleName(grantTo); err != nil {
					return &ExitError{Code: 2, Err: fmt.Errorf("--grant-to: %w", err)}
				}
			}
			if timeout < 0 || lockTimeout < 0 {
				return &ExitError{Code: 2, Err: errors.New("--timeout and --lock-timeout cannot be negative")}
			}
			ctx, cancel := cmd.Context(), context.CancelFunc(func() {})
			if timeout > 0 {
				ctx, cancel = context.WithTimeout(ctx, timeout)
			}
			defer cancel()
			if err := migrations.Apply(ctx, kind, url, migrations.WithLockTimeout(lockTimeout),
				migrations.WithLogger(a.logger(cmd, "migrate"))); err != nil {
				return err
			}
			v, err := migrations.Version(ctx, kind, url)
			if err != nil {
				return err
			}
			t := newTable().row(fmt.Sprintf("%s migrated to version %d", kind, v))
			if grantTo != "" {
				if err := migrations.GrantServing(ctx, kind, url, grantTo); err != nil {
					return err
				}
				t.row(fmt.Sprintf("%s may serve %s: data privileges only", grantTo, kind))
			}
			res := struct {
				DB        migrations.DB `json:"db"`
				Version   int64         `json:"version"`
				GrantedTo string        `json:"granted_to,omitempty"`
			}{kind, v, grantTo}
			return out.print(cmd.OutOrStdout(), res, t)
		},
	}
	c.Flags().StringVar(&db, "db", "", "which database: paydb, proxydb or lockdb (required)")
	c.Flags().DurationVar(&timeout, "timeout", 0, "give up (exit 1) after this long, rolling back the migration in progress; 0: no limit (an index build on a large table takes minutes)")
	c.Flags().DurationVar(&lockTimeout, "lock-timeout", migrations.DefaultLockTimeout,
		"longest a migration waits for a table lock before it is rolled back and tried again, so the table's traffic never queues behind it for longer; 0: the database's own lock_timeout")
	c.Flags().StringVar(&grantTo, "grant-to", "", "after migrating, give this existing role what serving the database needs and nothing more (rows and sequences; it must not be a superuser or own the schema): serve as it, migrate as the owner; run again after every migration")
	dbURL.register(c, "that database")
	out.register(c, false)
	return c
}
