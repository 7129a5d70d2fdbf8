package cmd

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/payment"
)

func newServePaymentCmd(a *app) *cobra.Command {
	var (
		f           serverFlags
		currency    string
		ledgerCheck time.Duration
		maxConns    int32
		sla         time.Duration
	)
	c := &cobra.Command{
		Use:   "payment",
		Short: "Run the payment resource: accounts, payouts and the ledger in paydb (guard 1)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !wire.CurrencyPattern.MatchString(currency) {
				return &ExitError{Code: 2, Err: fmt.Errorf("--currency must be a three-letter upper-case ISO 4217 code (e.g. EUR), got %q", currency)}
			}
			if err := checkFlagRanges(cmd, []intRange{{"max-db-conns", 0, maxDBConns}}, "ledger-check-interval", "resolution-sla"); err != nil {
				return err
			}
			env, err := f.setup(cmd, a)
			if err != nil {
				return err
			}
			cfg := payment.Config{
				Addr:                f.listen,
				DatabaseURL:         env.DatabaseURL,
				Currency:            currency,
				Logger:              env.Logger,
				Registry:            env.Registry,
				Auth:                env.Auth,
				TLS:                 env.TLS,
				LedgerCheckInterval: ledgerCheck,
				MaxConns:            maxConns,
				ResolutionSLA:       sla,
			}
			return env.run(cmd.Context(), func(ctx context.Context) error { return payment.Run(ctx, cfg) })
		},
	}
	f.register(c, payment.Role, "127.0.0.1:7102", migrations.PayDB)
	c.Flags().StringVar(&currency, "currency", payment.DefaultCurrency, "the one currency of every account and payout (ISO 4217 code)")
	c.Flags().DurationVar(&ledgerCheck, "ledger-check-interval", 30*time.Second, "how often balances are compared with the ledger (INV-03)")
	c.Flags().Int32Var(&maxConns, "max-db-conns", 16, "largest number of paydb connections (0: the database URL's pool_max_conns, else 16)")
	c.Flags().DurationVar(&sla, "resolution-sla", payment.DefaultResolutionSLA, "how long a payout must have been RAIL_AMBIGUOUS before an operator may abandon it")
	return c
}

// maxDBConns is the largest --max-db-conns: beyond it, a pool asks for more
// connections than a PostgreSQL server is configured to give.
const maxDBConns = 10_000
