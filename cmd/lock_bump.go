package cmd

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/lock"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/pgbackend"
)

func newLockBumpCmd(a *app) *cobra.Command {
	var (
		to         int64
		fromGuards bool
		margin     int64
		dbURL      databaseURL
		cf         clientFlags
		out        output
	)
	c := &cobra.Command{
		Use:   "bump-tokens (--to N | --from-guards) --database-url-file FILE",
		Short: "After restoring lockdb or promoting a replica (PostgreSQL backend), make every future token greater than N (D-13); never moves tokens down",
		Long: "After restoring lockdb from a backup, or promoting an asynchronous replica of it, run this before the\n" +
			"lock service grants again (stop every lock service first): with --to N, N above the highest fence\n" +
			"either guard has stored (payouts status --lock-url '' prints each guard's high_fence) by a margin, since tokens granted after the\n" +
			"backup may not have reached a guard yet; with --from-guards, it reads both guards' GET /v1/fences/high itself\n" +
			"(with the operator or reconciler token) and bumps to the larger plus --margin. It refuses to move the\n" +
			"token sequence down. For the etcd backend use etcdutl snapshot restore --bump-revision instead.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			url, err := dbURL.value()
			if err != nil {
				return err
			}
			if fromGuards == (to != 0) {
				return &ExitError{Code: 2, Err: fmt.Errorf("give exactly one of --to N and --from-guards")}
			}
			if !fromGuards && cmd.Flags().Changed("margin") {
				// It was ignored: the bump went to N, not N plus it.
				return &ExitError{Code: 2, Err: fmt.Errorf("--margin is for --from-guards: with --to N the sequence is moved to N itself (add the margin to N)")}
			}
			// Tokens are 1 .. 2^53-1 (exact as JSON numbers), and so is
			// the margin: one past them failed as the bump ran (exit 1),
			// --margin only after both guards had been asked.
			var ranges []intRange
			if !fromGuards {
				ranges = append(ranges, intRange{"to", 1, int(fencing.MaxToken)})
			}
			if fromGuards {
				ranges = append(ranges, intRange{"margin", 1, int(fencing.MaxToken)})
			}
			if err := checkFlagRanges(cmd, ranges); err != nil {
				return err
			}
			ctx, cancel := callCtx(cmd)
			defer cancel()
			var fences []lock.GuardFence
			if fromGuards {
				token, hc, err := cf.connect()
				if err != nil {
					return err
				}
				guards := []lock.Guard{
					{Name: "payment", URL: cf.paymentURL, Token: token},
					{Name: "proxy", URL: cf.proxyURL, Token: token},
				}
				if fences, err = lock.GuardsHighFence(ctx, guards, httpx.WithHTTPClient(hc)); err != nil {
					return err
				}
				t, err := lock.BumpTarget(fences, margin)
				if err != nil {
					return err
				}
				to = int64(t)
			}
			bump := pgbackend.BumpTokens
			if fromGuards {
				bump = pgbackend.BumpTokensAtLeast // tokens already above the guards + margin: nothing to do
			}
			from, err := bump(ctx, url, fencing.Token(to))
			if err != nil {
				return err
			}
			res := struct {
				From   fencing.Token     `json:"from"`
				To     fencing.Token     `json:"to"`
				Guards []lock.GuardFence `json:"guards,omitempty"`
			}{from, fencing.Token(max(to, int64(from))), fences}
			tbl := newTable("HIGHEST_ISSUED_WAS", "EVERY_FUTURE_TOKEN_ABOVE", "GUARDS")
			guardsCol := "-"
			for i, f := range fences {
				if i == 0 {
					guardsCol = ""
				} else {
					guardsCol += ", "
				}
				guardsCol += fmt.Sprintf("%s=%s", f.Guard, f.Token)
			}
			return out.print(cmd.OutOrStdout(), res, tbl.row(res.From.String(), res.To.String(), guardsCol))
		},
	}
	c.Flags().Int64Var(&to, "to", 0, "every future token will be greater than this")
	c.Flags().BoolVar(&fromGuards, "from-guards", false, "read both guards' highest fence (GET /v1/fences/high) and bump above the larger plus --margin")
	c.Flags().Int64Var(&margin, "margin", 1000, "with --from-guards: how far above the guards' highest fence to bump (1..2^53-1)")
	cf.register(c, "operator or reconciler", paymentService, proxyService)
	dbURL.register(c, "lockdb")
	out.register(c, false)
	return c
}
