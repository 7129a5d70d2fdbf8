package cmd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/reconcile"
)

func newReconcileCmd(a *app) *cobra.Command {
	var (
		cf            clientFlags
		out           output
		cfg           reconcile.Config
		railTokenFile string
		reportFile    string
		pprof         pprofFlag
	)
	c := &cobra.Command{
		Use:   "reconcile",
		Short: "Check every invariant across the services and resolve ambiguous payouts from rail evidence (exit 0 clean, 1 findings, 2 could not run)",
		Long: `reconcile asserts after the fact what the guards make impossible (INV-01..INV-08), across the
lock service, the payment resource, the rail proxy and the rail, and resolves RAIL_AMBIGUOUS
payouts from rail evidence under a payout:{account} grant.

--once makes one pass (for cron) and exits 0 when clean, 1 when anything was found, 2 when it
could not run. Without --once it makes a pass every --interval and serves /metrics and /healthz
on --listen. docs/operations.md explains every finding.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cannotRun := func(err error) error { return &ExitError{Code: reconcile.ExitCannotRun, Err: err} }
			if err := checkFlagRanges(cmd, []intRange{{"page-size", 1, 1000}, {"bulk-page-size", 1, wire.MaxBulkLimit}, {"max-findings", 1, math.MaxInt}, {"grant-log-lost-through", 0, int(fencing.MaxToken)}},
				"request-timeout", "ambiguity-sla"); err != nil {
				return err
			}
			if err := checkNonNegativeDurations(cmd, "settlement-window", "lock-wait", "grant-retention"); err != nil {
				return err
			}
			if cfg.LockWait > backend.MaxWait {
				return &ExitError{Code: 2, Err: fmt.Errorf("--lock-wait must be at most %s (the lock service's longest wait), got %s", backend.MaxWait, cfg.LockWait)}
			}
			token, hc, err := cf.connect()
			if err != nil {
				return err
			}
			if err := pprof.check(); err != nil {
				return cannotRun(err)
			}
			if cfg.RailToken, err = bearerSecret("rail-token", cfg.RailToken, railTokenFile); err != nil {
				return cannotRun(err)
			}
			if cfg.RailReportToken, err = bearerSecret("rail-report-token", cfg.RailReportToken, reportFile); err != nil {
				return cannotRun(err)
			}
			if cfg.SettlementWindow < 0 || cfg.AmbiguitySLA <= 0 {
				return cannotRun(errors.New("--settlement-window must not be negative and --ambiguity-sla must be positive"))
			}
			if !cfg.Once && cfg.Interval <= 0 {
				return cannotRun(errors.New("--interval must be positive (or use --once)"))
			}
			if cfg.Owner == "" {
				host, _ := os.Hostname()
				cfg.Owner = fmt.Sprintf("reconciler@%s/%d", host, os.Getpid())
			}
			cfg.LockURL, cfg.PaymentURL, cfg.ProxyURL, cfg.RailURL, cfg.Token = cf.lockURL, cf.paymentURL, cf.proxyURL, cf.railURL, token
			cfg.JSON, cfg.HTTPClient = out.isJSON(), hc
			cfg.Out, cfg.Logger, cfg.Registry, cfg.Resolve = cmd.OutOrStdout(), a.logger(cmd, "reconcile"), a.registry, true
			code := reconcile.ExitClean
			err = runWithPprof(cmd.Context(), pprof.addr, cfg.Logger, func(ctx context.Context) error {
				var err error
				code, err = reconcile.Run(ctx, cfg)
				return err
			})
			if err != nil && code == reconcile.ExitClean {
				code = reconcile.ExitCannotRun // the profiler's listener failed
			}
			if code != reconcile.ExitClean || err != nil {
				// With findings and no error, the report says what was found.
				return &ExitError{Code: code, Err: err}
			}
			return nil
		},
	}
	cf.register(c, "reconciler", lockService, paymentService, proxyService, railService)
	out.register(c, true)
	fl := c.Flags()
	fl.BoolVar(&cfg.Once, "once", false, "make one pass and exit: 0 clean, 1 findings, 2 could not run (for cron)")
	fl.DurationVar(&cfg.Interval, "interval", time.Minute, "pause between passes in continuous mode")
	fl.StringVar(&cfg.Listen, "listen", "127.0.0.1:7105", "address of /metrics and /healthz in continuous mode")
	pprof.register(c)
	fl.StringVar(&cfg.MetricsFile, "metrics-file", "", "after every pass, write the findings in the Prometheus text format to this file (atomic rename; node_exporter textfile collector)")
	fl.DurationVar(&cfg.SettlementWindow, "settlement-window", reconcile.DefaultSettlementWindow, "look an ambiguous payout up at the rail once it has been ambiguous this long (the rail's own final flag still decides)")
	fl.DurationVar(&cfg.LockWait, "lock-wait", reconcile.DefaultLockWait, "how long resolving an ambiguous payout waits for its account's lock when another session holds it (an executor keeps a grant between its rounds); 0: not at all, the payout is left for a later pass")
	fl.DurationVar(&cfg.GrantRetention, "grant-retention", backend.DefaultGrantRetention, "the lock service's --grant-retention: ledger entries and submissions written before it (less "+reconcile.GrantClockSkew.String()+" for clock skew, or half a retention under twice that) are not checked against the grant log, whose grants of them may have been compacted; 0 checks them all")
	fl.Int64Var((*int64)(&cfg.GrantLogLostThrough), "grant-log-lost-through", 0, "after a restore of the lock service (DESIGN D-13, docs/lock-service.md): the token it was bumped to; ledger entries and submissions under tokens at or below it are not checked against the grant log, which lost the grants issued between the backup and the restore (counted in a note); 0: every one is checked")
	fl.DurationVar(&cfg.AmbiguitySLA, "ambiguity-sla", reconcile.DefaultAmbiguitySLA, "report ambiguous payouts older than this for an operator")
	fl.StringVar(&cfg.RailToken, "rail-token", "", "the rail credential: bearer of every lookup at the rail (a reconciler-role token of the rail), and of its settlement report without --rail-report-token-file; required (visible in ps: prefer --rail-token-file)")
	fl.StringVar(&railTokenFile, "rail-token-file", "", "file holding the rail credential (required unless --rail-token is given); the reconciler never sends its own --token to the rail")
	fl.StringVar(&cfg.RailReportToken, "rail-report-token", "", "bearer of the rail's settlement report (an operator's right at the rail; visible in ps: prefer --rail-report-token-file)")
	fl.StringVar(&reportFile, "rail-report-token-file", "", "file holding the bearer of the rail's settlement report (an operator-role token of the rail); without it the report is asked for with the rail credential, and a refusal is noted in the report")
	fl.StringVar(&cfg.Owner, "owner", "", "owner name of the reconciler's lock session (default reconciler@host/pid)")
	fl.BoolVar(&cfg.RailPerPayout, "rail-per-payout", false, "look each payout up at the rail instead of reading the rail's settlement report (a round trip per payout; payments under unknown references are then not checked)")
	fl.IntVar(&cfg.PageSize, "page-size", reconcile.DefaultPageSize, "page size of every list read (1..1000)")
	fl.IntVar(&cfg.BulkPageSize, "bulk-page-size", reconcile.DefaultBulkPageSize, "page size of the payout, submission, settlement-report and ledger streams (1..10000)")
	fl.IntVar(&cfg.MaxFindings, "max-findings", reconcile.DefaultMaxFindings, "list at most this many findings (all are counted)")
	fl.DurationVar(&cfg.RequestTimeout, "request-timeout", 30*time.Second, "timeout of each call to a service")
	fl.StringVar(&cfg.StateFile, "state-file", "", "remember which safety events were reported, so each fenced_out, token_regression, rejected_transition or duplicate_attempt event is reported (exit 1) by one pass only; without it every --once run, and the first pass of a continuous reconciler, reports every event ever recorded")
	return c
}
