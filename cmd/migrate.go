package cmd

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/migrations"
)

func newMigrateCmd(a *app) *cobra.Command {
	var (
		db    string
		dbURL databaseURL
		out   output
	)
	c := &cobra.Command{
		Use:   "migrate --db paydb|proxydb|lockdb",
		Short: "Apply the embedded schema migrations to paydb, proxydb or lockdb (idempotent)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			kind, err := migrations.Parse(db)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			url, err := dbURL.value()
			if err != nil {
				return err
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
			res := struct {
				DB      migrations.DB `json:"db"`
				Version int64         `json:"version"`
			}{kind, v}
			return out.print(cmd.OutOrStdout(), res, newTable().row(fmt.Sprintf("%s migrated to version %d", kind, v)))
		},
	}
	c.Flags().StringVar(&db, "db", "", "which database: paydb, proxydb or lockdb")
	dbURL.register(c, "that database")
	out.register(c, false)
	return c
}
