// Package cmd is the payouts command tree: one file per role, each small,
// each ending in that role's Run.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Version is set at build time (-ldflags "-X github.com/payouts/payouts/cmd.Version=...").
var Version = "dev"

// ExitError carries a specific exit code (reconcile: 1 findings, 2 could not run).
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit %d", e.Code)
	}
	return e.Err.Error()
}
func (e *ExitError) Unwrap() error { return e.Err }

// NewRoot builds the command tree.
func NewRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "payouts",
		Short:         "Pay money out through a non-idempotent rail at most once per payout",
		Long:          "payouts pays money out through an external, non-idempotent payment rail at most once per payout,\nusing fencing tokens from a lock service checked by two independent guards.\nEvery flag can also be set with an environment variable PAYOUTS_<FLAG> (upper snake case).",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return applyEnv(cmd)
		},
	}
	root.PersistentFlags().String("log-level", "info", "log level: debug, info, warn, error")
	serve := &cobra.Command{Use: "serve", Short: "Run a server role (lock, payment, proxy, rail)"}
	run := &cobra.Command{Use: "run", Short: "Run a worker role (executor)"}
	dev := &cobra.Command{Use: "dev", Short: "Run the whole system locally on throwaway infrastructure"}
	root.AddCommand(serve, run, dev, newMigrateCmd(), newVersionCmd())
	for _, reg := range registrations {
		reg(root, serve, run, dev)
	}
	return root
}

// registrations lets each role's file add its commands (see init in each file).
var registrations []func(root, serve, run, dev *cobra.Command)

func register(fn func(root, serve, run, dev *cobra.Command)) {
	registrations = append(registrations, fn)
}

// Execute runs the CLI and returns the process exit code.
func Execute() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := NewRoot()
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(os.Stderr, "payouts:", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(os.Stderr, "payouts:", err)
	return 1
}

// EnvName is the environment variable for a flag: PAYOUTS_<FLAG>.
func EnvName(flag string) string {
	return "PAYOUTS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// PAYOUTS_<FLAG> environment variable.
func applyEnv(cmd *cobra.Command) error {
	var firstErr error
	set := func(f *pflag.Flag) {
		if f.Changed || firstErr != nil {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if err := f.Value.Set(v); err != nil {
				firstErr = fmt.Errorf("environment variable %s=%q: %w", EnvName(f.Name), v, err)
				return
			}
			f.Changed = true
		}
	}
	cmd.Flags().VisitAll(set)
	cmd.InheritedFlags().VisitAll(set)
	return firstErr
}
