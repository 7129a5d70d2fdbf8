package cmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/pgbackend"
)

func newLockBumpCmd(a *app) *cobra.Command {
	var (
		to    int64
		dbURL databaseURL
		out   output
	)
	c := &cobra.Command{
		Use:   "bump-tokens --to N --database-url-file FILE",
		Short: "After restoring lockdb (PostgreSQL backend), make every future token greater than N (D-13); never moves tokens down",
		Long: "After restoring lockdb from a backup, run this with N at or above the highest fence either guard\n" +
			"has stored (payouts reconcile prints it) before the lock service grants again. It refuses to move\n" +
			"the token sequence down. For the etcd backend use etcdutl snapshot restore --bump-revision instead.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			url, err := dbURL.value()
			if err != nil {
				return err
			}
			if to <= 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--to must be a positive token")}
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			from, err := pgbackend.BumpTokens(ctx, url, fencing.Token(to))
			if err != nil {
				return err
			}
			res := struct {
				From fencing.Token `json:"from"`
				To   fencing.Token `json:"to"`
			}{from, fencing.Token(max(to, int64(from)))}
			return out.print(cmd.OutOrStdout(), res, newTable("HIGHEST_ISSUED_WAS", "EVERY_FUTURE_TOKEN_ABOVE").row(res.From.String(), res.To.String()))
		},
	}
	c.Flags().Int64Var(&to, "to", 0, "every future token will be greater than this")
	dbURL.register(c, "lockdb")
	out.register(c, false)
	return c
}
