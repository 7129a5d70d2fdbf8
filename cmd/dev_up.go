package cmd

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/dev/stack"
)

func newDevUpCmd(a *app) *cobra.Command {
	var (
		dir        string
		out        output
		portBase   int
		settlement time.Duration
	)
	c := &cobra.Command{
		Use:   "up",
		Short: "Run every role locally on throwaway PostgreSQL and embedded etcd (foreground; Ctrl-C stops)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			logger := a.logger(cmd, "dev")
			ctx := cmd.Context()
			st, err := stack.Start(ctx, stack.Options{Dir: dir, PortBase: portBase, Logger: logger, SettlementWindow: settlement})
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if out.isJSON() {
				b, _ := json.Marshal(st.Ready)
				fmt.Fprintln(cmd.OutOrStdout(), string(b))
			} else {
				printReady(cmd.OutOrStdout(), st.Ready)
			}
			var runErr error
			select {
			case <-ctx.Done():
				logger.Info("stopping the stack")
			case runErr = <-st.Failed():
				// Said once, on one line, by the exit below.
			}
			if err := st.Stop(); err != nil && runErr == nil {
				runErr = err
			} else if err != nil {
				runErr = fmt.Errorf("%w; %w", runErr, err)
			}
			if runErr != nil {
				return &ExitError{Code: 1, Err: fmt.Errorf("the stack stopped: %w", runErr)}
			}
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", ".dev/stack", "directory for the databases, etcd data, auth file and logs (reused on the next run)")
	out.register(c, true)
	c.Flags().IntVar(&portBase, "port-base", 7100, "ports: lock +1, payment +2, proxy +3, rail +4, PostgreSQL +5, etcd +6/+7; 0 picks free ports")
	c.Flags().DurationVar(&settlement, "settlement-window", 3*time.Second, "the rail stub's settlement window")
	return c
}

func printReady(w io.Writer, r stack.Ready) {
	fmt.Fprintf(w, "payouts dev stack is up (data in %s)\n\n", r.Dir)
	fmt.Fprintf(w, "  lock service      %s\n  payment resource  %s\n  rail proxy        %s\n  rail stub         %s\n\n", r.LockURL, r.PaymentURL, r.ProxyURL, r.RailURL)
	fmt.Fprintf(w, "  paydb    %s\n  proxydb  %s\n  lockdb   %s\n\n", r.DatabaseURLs.PayDB, r.DatabaseURLs.ProxyDB, r.DatabaseURLs.LockDB)
	fmt.Fprintf(w, "  tokens   executor=%s\n           reconciler=%s\n           operator=%s\n\n", r.Tokens.Executor, r.Tokens.Reconciler, r.Tokens.Operator)
	fmt.Fprintf(w, "  logs     %s/logs/\n\n", r.Dir)
	fmt.Fprintf(w, "Try: curl -s -H 'Authorization: Bearer %s' %s/v1/accounts\nCtrl-C stops everything.\n", r.Tokens.Operator, r.PaymentURL)
}
