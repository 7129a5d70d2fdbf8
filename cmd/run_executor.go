package cmd

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/executor"
	"github.com/payouts/payouts/internal/obs"
)

func init() {
	register(func(root, serve, run, dev *cobra.Command) { run.AddCommand(newRunExecutorCmd()) })
}

func newRunExecutorCmd() *cobra.Command {
	var (
		cf          clientFlags
		owner       string
		concurrency int
		ttl         time.Duration
		poll        time.Duration
		callTimeout time.Duration
		metrics     string
	)
	c := &cobra.Command{
		Use:   "executor",
		Short: "Drive payouts through both guards under payout:{account} locks (SIGTERM: finish the step, release, exit 0)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			level, _ := cmd.Flags().GetString("log-level")
			logger := obs.NewLogger(cmd.ErrOrStderr(), obs.ParseLevel(level), executor.Role)
			if cf.token == "" {
				return &ExitError{Code: 2, Err: fmt.Errorf("--token (or %s) is required: the executor's bearer token", EnvName("token"))}
			}
			if owner == "" {
				host, _ := os.Hostname()
				owner = fmt.Sprintf("executor@%s/%d", host, os.Getpid())
			}
			// The first SIGINT/SIGTERM cancels cmd.Context() (root.go): the
			// executor finishes its current steps and releases its locks. A
			// second one exits at once.
			sigs := make(chan os.Signal, 2)
			signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
			defer signal.Stop(sigs)
			go func() {
				<-sigs
				logger.Info("stop requested: finishing current steps, releasing locks (signal again to exit at once)")
				<-sigs
				logger.Warn("second signal: exiting at once; held locks expire with the session TTL")
				os.Exit(1)
			}()
			err := executor.Run(cmd.Context(), executor.Config{
				Owner: owner, Concurrency: concurrency, SessionTTL: ttl, PollInterval: poll, CallTimeout: callTimeout,
				LockURL: cf.lockURL, PaymentURL: cf.paymentURL, ProxyURL: cf.proxyURL, Token: cf.token,
				MetricsAddr: metrics, Logger: logger, Registry: obs.NewRegistry(), Hooks: executor.HooksFromEnv(),
			})
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			return nil
		},
	}
	cf.register(c)
	fl := c.Flags()
	fl.StringVar(&owner, "owner", "", "this executor's name in the lock service (default executor@HOST/PID)")
	fl.IntVar(&concurrency, "concurrency", executor.DefaultConcurrency, "accounts worked on at once")
	fl.DurationVar(&ttl, "session-ttl", executor.DefaultSessionTTL, "lock session TTL (keepalive every TTL/3)")
	fl.DurationVar(&poll, "poll-interval", executor.DefaultPollInterval, "how often to ask for work when there was none")
	fl.DurationVar(&callTimeout, "call-timeout", executor.DefaultCallTimeout, "timeout of each call to the lock service and the payment resource")
	fl.StringVar(&metrics, "metrics-listen", "", "serve /metrics and /healthz on this address (e.g. 127.0.0.1:9101); empty: off")
	return c
}
