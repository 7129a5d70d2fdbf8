package cmd

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/rail"
	"github.com/payouts/payouts/rail/railclient"
)

func newServeRailCmd(a *app) *cobra.Command {
	var (
		sf     serverFlags
		window time.Duration
		f      railclient.Faults
		state  string
	)
	c := &cobra.Command{
		Use:   "rail",
		Short: "Run the rail stub: an in-memory, non-idempotent stand-in for the external payment network",
		Long: `Run the rail stub. Every accepted POST /v1/payments is a new payment (duplicates are real money
moved twice). Faults can be injected at start with the flags below or later with PUT /v1/faults.
GET /v1/settlement-report lists every payment ever accepted (operator only). The payments live in
memory; with --state-file they are also appended to that file before each is answered, and read
back on start, so the stub remembers what it paid across its restarts as a real rail does.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFlagRanges(cmd, []intRange{{"latency-ms", 0, rail.MaxLatencyMS}}); err != nil {
				return err
			}
			if err := checkNonNegativeDurations(cmd, "settlement-window"); err != nil {
				return err
			}
			if err := rail.ValidateFaults(f); err != nil {
				// The rail names the field of PUT /v1/faults; here it is the flag.
				pe := problem.From(err)
				var field string
				if !pe.Extension("field", &field) {
					return &ExitError{Code: 2, Err: fmt.Errorf("fault flags: %s", pe.Message)}
				}
				return &ExitError{Code: 2, Err: fmt.Errorf("--%s%s", strings.ReplaceAll(field, "_", "-"), strings.TrimPrefix(pe.Message, field+":"))}
			}
			env, err := sf.setup(cmd, a)
			if err != nil {
				return err
			}
			cfg := rail.Config{
				Addr: sf.listen, Logger: env.Logger, Registry: env.Registry, Auth: env.Auth, TLS: env.TLS,
				SettlementWindow: window, Faults: f, StateFile: state,
			}
			return env.run(cmd.Context(), func(ctx context.Context) error { return rail.Run(ctx, cfg) })
		},
	}
	sf.register(c, "rail", "127.0.0.1:7104", "")
	fl := c.Flags()
	fl.DurationVar(&window, "settlement-window", 10*time.Second, "a lookup by client reference is final once this long has passed since the newest attempt")
	fl.Float64Var(&f.TimeoutAfterAccept, "timeout-after-accept", 0, "rate (0..1) of payments made and then never answered")
	fl.Float64Var(&f.DropBeforeAccept, "drop-before-accept", 0, "rate (0..1) of requests dropped (connection closed) before any payment")
	fl.Float64Var(&f.ErrorAfterAccept, "error-after-accept", 0, "rate (0..1) of payments made and then answered with a 5xx")
	fl.Float64Var(&f.ErrorBeforeAccept, "error-before-accept", 0, "rate (0..1) of requests answered with a 5xx and no payment")
	fl.Int64Var(&f.LatencyMS, "latency-ms", 0, "latency added to every payment request, in milliseconds")
	fl.StringVar(&state, "state-file", "", "keep the payments in this file (created 0600; one JSON line per payment) across restarts; empty: in memory only")
	fl.StringVar(&f.DeclineBeneficiaryPrefix, "decline-beneficiary-prefix", railclient.DefaultDeclinePrefix, "beneficiary refs starting with this are declined (empty: none)")
	return c
}
