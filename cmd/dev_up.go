package cmd

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
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
		useTLS     bool
	)
	c := &cobra.Command{
		Use:   "up",
		Short: "Run every role locally on throwaway PostgreSQL and embedded etcd (foreground; Ctrl-C stops)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			// Every flag a role is started with is checked here, before
			// PostgreSQL and etcd are: the role's own refusal came only once
			// they were up, as a child that exited.
			if err := checkFlagRanges(cmd, []intRange{{"port-base", 0, 65535 - stack.PortSpan}}, "settlement-window"); err != nil {
				return err
			}
			logger := a.logger(cmd, "dev")
			if dropped := dropRoleEnv(); len(dropped) > 0 {
				logger.Info("not passed to the stack's roles, which dev up configures itself", "variables", dropped)
			}
			ctx, stopOnHangup := hangupStops(cmd.Context(), logger)
			defer stopOnHangup()
			st, err := stack.Start(ctx, stack.Options{Dir: dir, PortBase: portBase, Logger: logger, SettlementWindow: settlement, TLS: useTLS, KeepRailPayments: true})
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
	c.Flags().IntVar(&portBase, "port-base", 7100, "ports: lock +1, payment +2, proxy +3, rail +4, etcd +6/+7, PostgreSQL +8 (+5 stays free for a reconciler's default --listen); 0 picks free ports")
	c.Flags().DurationVar(&settlement, "settlement-window", 3*time.Second, "the rail stub's settlement window (positive)")
	c.Flags().BoolVar(&useTLS, "tls", false, "run every role over HTTPS with a throwaway CA made for this run (DIR/tls/ca.pem: pass it as --ca-file)")
	return c
}

// dropRoleEnv removes from this process's environment, which the stack's
// roles inherit, the PAYOUTS_<FLAG> variables of what dev up wires itself
// (addresses, URLs, credentials and files, the backend, migrations,
// authentication), and returns their names: one exported for the caller's
// own commands (PAYOUTS_DATABASE_URL for migrate, PAYOUTS_LISTEN, a token)
// would reach every role, and a role that does not take it (the etcd lock
// service and a database URL) refuses to start. Tuning variables
// (PAYOUTS_RESOLUTION_SLA, PAYOUTS_LOG_LEVEL, ...) still reach the roles.
func dropRoleEnv() []string {
	var dropped []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		flag, ok := strings.CutPrefix(name, "PAYOUTS_")
		if !ok || !wiredByDevUp(flag) {
			continue
		}
		os.Unsetenv(name)
		dropped = append(dropped, name)
	}
	slices.Sort(dropped)
	return dropped
}

// wiredByDevUp reports whether the flag of variable PAYOUTS_<flag> is one
// dev up sets for its roles, or would clash with what it sets.
func wiredByDevUp(flag string) bool {
	switch flag {
	case "LISTEN", "MIGRATE", "BACKEND", "INSECURE_NO_AUTH", "ETCD_PREFIX", "TOKEN", "RAIL_TOKEN":
		return true
	}
	for _, suffix := range []string{"_URL", "_URLS", "_FILE", "_ENDPOINTS", "_LISTEN", "_DIR"} {
		if strings.HasSuffix(flag, suffix) {
			return true
		}
	}
	return false
}

// hangupStops is ctx, also ended by SIGHUP (a closed terminal): dev up then
// stops the stack as on Ctrl-C. Left to its default the signal ended dev up
// alone: its children went with it, but PostgreSQL, which runs in a
// session of its own, kept running, and the next dev up on the directory
// refused to start beside it.
func hangupStops(parent context.Context, log *slog.Logger) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go func() {
		select {
		case <-hup:
			log.Info("stop requested: stopping the stack", "signal", syscall.SIGHUP.String())
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(hup)
		cancel()
	}
}

func printReady(w io.Writer, r stack.Ready) {
	fmt.Fprintf(w, "payouts dev stack is up (data in %s)\n\n", r.Dir)
	fmt.Fprintf(w, "  lock service      %s\n  payment resource  %s\n  rail proxy        %s\n  rail stub         %s\n\n", r.LockURL, r.PaymentURL, r.ProxyURL, r.RailURL)
	fmt.Fprintf(w, "  paydb    %s\n  proxydb  %s\n  lockdb   %s\n\n", r.DatabaseURLs.PayDB, r.DatabaseURLs.ProxyDB, r.DatabaseURLs.LockDB)
	fmt.Fprintf(w, "  tokens   executor=%s\n           reconciler=%s\n           operator=%s\n           proxy=%s (the proxy's own, at the rail)\n",
		r.Tokens.Executor, r.Tokens.Reconciler, r.Tokens.Operator, r.Tokens.Proxy)
	fmt.Fprintf(w, "           also in files (0600): %s/secrets/ROLE.token, for --token-file\n\n", r.Dir)
	ca := ""
	if r.TLS != nil {
		fmt.Fprintf(w, "  TLS      throwaway CA %s (--ca-file)\n\n", r.TLS.CA)
		ca = " --cacert " + r.TLS.CA
	}
	fmt.Fprintf(w, "  logs     %s/logs/\n\n", r.Dir)
	fmt.Fprintf(w, "Try: curl -s%s -H \"Authorization: Bearer $(cat %s)\" %s/v1/accounts\nCtrl-C stops everything.\n", ca, r.TokenFiles["operator"], r.PaymentURL)
}
