package cmd

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/migrations"
)

func newMigrateCmd() *cobra.Command {
	var db, url string
	c := &cobra.Command{
		Use:   "migrate",
		Short: "Apply the embedded schema migrations to paydb, proxydb or lockdb (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := migrations.Parse(db)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if url == "" {
				return &ExitError{Code: 2, Err: fmt.Errorf("--database-url is required")}
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Minute)
			defer cancel()
			if err := migrations.Apply(ctx, kind, url); err != nil {
				return err
			}
			v, err := migrations.Version(ctx, kind, url)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s migrated to version %d\n", kind, v)
			return nil
		},
	}
	c.Flags().StringVar(&db, "db", "", "which database: paydb, proxydb or lockdb")
	c.Flags().StringVar(&url, "database-url", "", "PostgreSQL URL of that database")
	return c
}
