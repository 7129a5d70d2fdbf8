package cmd

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/executor"
)

func newRunExecutorCmd(a *app) *cobra.Command {
	var (
		cf          clientFlags
		owner       string
		concurrency int
		ttl         time.Duration
		poll        time.Duration
		callTimeout time.Duration
		proxyTO     time.Duration
		grace       time.Duration
		linger      time.Duration
		metrics     string
		pprof       pprofFlag
	)
	c := &cobra.Command{
		Use:   "executor",
		Short: "Drive payouts through both guards under payout:{account} locks (SIGTERM: finish the step, release, exit 0; a second signal: exit at once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkFlagRanges(cmd, []intRange{{"concurrency", 1, executor.MaxConcurrency}},
				"session-ttl", "poll-interval", "call-timeout", "proxy-timeout", "shutdown-grace"); err != nil {
				return err
			}
			logger := a.logger(cmd, executor.Role)
			token, hc, err := cf.connect()
			if err != nil {
				return err
			}
			if err := pprof.check(); err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if owner == "" {
				host, _ := os.Hostname()
				owner = fmt.Sprintf("executor@%s/%d", host, os.Getpid())
			}
			cfg := executor.Config{
				Owner: owner, Concurrency: concurrency, SessionTTL: ttl, PollInterval: poll, CallTimeout: callTimeout, GrantLinger: linger,
				ProxyTimeout: proxyTO, ShutdownGrace: grace,
				LockURL: cf.lockURL, PaymentURL: cf.paymentURL, ProxyURL: cf.proxyURL, Token: token, HTTPClient: hc,
				MetricsAddr: metrics, Logger: logger, Registry: a.registry, Hooks: executor.HooksFromEnv(),
			}
			if err := runWithPprof(cmd.Context(), pprof.addr, logger, func(ctx context.Context) error { return executor.Run(ctx, cfg) }); err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			return nil
		},
	}
	cf.register(c, executor.Role, lockService, paymentService, proxyService)
	fl := c.Flags()
	fl.StringVar(&owner, "owner", "", "this executor's name in the lock service (default executor@HOST/PID)")
	fl.IntVar(&concurrency, "concurrency", executor.DefaultConcurrency, "accounts worked on at once (1..256)")
	fl.DurationVar(&ttl, "session-ttl", executor.DefaultSessionTTL, "lock session TTL, 1s to 5m (keepalive every TTL/3)")
	fl.DurationVar(&poll, "poll-interval", executor.DefaultPollInterval, "how often to ask for work when there was none (at least 10ms)")
	fl.DurationVar(&callTimeout, "call-timeout", executor.DefaultCallTimeout, "timeout of each call to the lock service and the payment resource, and of each lookup at the rail proxy (not of submissions: --proxy-timeout)")
	fl.DurationVar(&proxyTO, "proxy-timeout", executor.DefaultProxyTimeout, "timeout of each submission to the rail proxy, which waits for the rail (keep it well above the proxy's --rail-timeout)")
	fl.DurationVar(&grace, "shutdown-grace", executor.DefaultShutdownGrace, "on SIGTERM, how long to wait for submissions in flight at the rail proxy before giving them up (they stay RAIL_SUBMITTED; the next holder asks the proxy first), then release and exit")
	fl.DurationVar(&linger, "grant-linger", executor.DefaultGrantLinger, "keep an account's lock this long after its work ran out, for its next payouts (0: release at once; at most 30s)")
	pprof.register(c)
	fl.StringVar(&metrics, "metrics-listen", "", "serve /metrics and /healthz on this address (e.g. 127.0.0.1:9101); empty: off")
	return c
}
