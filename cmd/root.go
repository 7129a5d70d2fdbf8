// Package cmd is the payouts command tree. root.go lists every command;
// each lives in its own small file and ends in its role's Run. The
// process-wide pieces (logger, metrics registry, signal handling, output
// format) are built in one place each: app.go, Execute and output.go.
package cmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
)

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

// roleGCPercent is the garbage collector's target (GOGC) of the
// long-running roles unless the environment sets GOGC: their live heaps
// are small (tens of MB) and short-lived request garbage dominates, so
// collecting at 5× the live heap instead of 2× spends less CPU on it
// (docs/benchmarks-history.md: about 5 % of all CPU per payout end to end).
const roleGCPercent = 400

// roleHook runs before every serve and run command (cobra runs only the
// nearest persistent hook, so it applies the environment too).
func roleHook(cmd *cobra.Command, _ []string) error {
	tuneGC()
	return prepare(cmd)
}

// prepare applies the environment (PAYOUTS_*) to the flags, then refuses a
// --log-level the logger cannot take as a usage error: an unknown level
// became info without a word.
func prepare(cmd *cobra.Command) error {
	if err := applyEnv(cmd); err != nil {
		return err
	}
	level, err := cmd.Flags().GetString("log-level")
	if err != nil {
		return err
	}
	if _, err := obs.ParseLevel(level); err != nil {
		return &ExitError{Code: 2, Err: fmt.Errorf("--log-level %w", err)}
	}
	return nil
}

// tuneGC sets roleGCPercent unless GOGC is set.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(roleGCPercent)
	}
}

// NewRoot builds the command tree of one process.
func NewRoot() *cobra.Command { return newRoot(newApp()) }

func newRoot(a *app) *cobra.Command {
	root := &cobra.Command{
		Use:           "payouts",
		Short:         "Pay money out through a non-idempotent rail at most once per payout",
		Long:          "payouts pays money out through an external, non-idempotent payment rail at most once per payout,\nusing fencing tokens from a lock service checked by two independent guards.\nEvery flag can also be set with an environment variable PAYOUTS_<FLAG> (upper snake case).",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			return prepare(cmd)
		},
	}
	root.PersistentFlags().StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	// A mistyped or unknown flag is a usage error: exit 2, like every
	// other refusal to run.
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &ExitError{Code: 2, Err: err} })

	serve := &cobra.Command{Use: "serve", Short: "Run a server role (lock, payment, proxy, rail)", PersistentPreRunE: roleHook}
	serve.AddCommand(
		newServeLockCmd(a),
		newServePaymentCmd(a),
		newServeProxyCmd(a),
		newServeRailCmd(a),
	)
	run := &cobra.Command{Use: "run", Short: "Run a worker role (executor)", PersistentPreRunE: roleHook}
	run.AddCommand(newRunExecutorCmd(a))
	dev := &cobra.Command{Use: "dev", Short: "Run the whole system locally on throwaway infrastructure"}
	dev.AddCommand(
		newDevUpCmd(a),
		newDevDemoCmd(a),
	)
	root.AddCommand(
		serve,
		run,
		newReconcileCmd(a),
		newPayoutCmd(a),
		newLockCmd(a),
		newMigrateCmd(a),
		newStatusCmd(a),
		dev,
		newBenchCmd(a),
		newVersionCmd(a),
	)
	usageErrorArgs(root)
	return root
}

// Execute runs the command line and returns the process exit code; see
// interruptContext for what SIGINT and SIGTERM do.
func Execute() int {
	ctx, stop := interruptContext()
	defer stop()
	return run(ctx, NewRoot(), os.Stderr)
}

func run(ctx context.Context, root *cobra.Command, stderr io.Writer) int {
	err := root.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee *ExitError
	if errors.As(err, &ee) {
		if ee.Err != nil {
			fmt.Fprintln(stderr, "payouts:", ee.Err)
		}
		return ee.Code
	}
	fmt.Fprintln(stderr, "payouts:", err)
	if problem.Has(err, problem.Unauthorized) || problem.Has(err, problem.Forbidden) {
		return 2 // a refused credential is not going to work on a retry
	}
	if strings.HasPrefix(err.Error(), "unknown command ") {
		return 2 // cobra's answer to `payouts foo`: a usage error
	}
	return 1
}

// EnvName is the environment variable for a flag: PAYOUTS_<FLAG>.
func EnvName(flag string) string {
	return "PAYOUTS_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// PAYOUTS_<FLAG> environment variable. The command line wins: a flag of a
// pair of alternatives (--token and --token-file, --database-url and
// --database-url-file, --json and --output, ...) given there also keeps
// its partner's variable out, so PAYOUTS_TOKEN in a cron job's environment
// does not clash with a --token-file on the line, nor PAYOUTS_JSON with an
// --output table. A value a variable cannot set is a usage error: exit 2,
// like the same value given as the flag. A flag set from its variable is
// marked so (fromEnv), for messages that name where a value came from.
func applyEnv(cmd *cobra.Command) error {
	onLine := map[string]bool{}
	note := func(f *pflag.Flag) {
		if f.Changed {
			onLine[f.Name] = true
		}
	}
	cmd.Flags().VisitAll(note)
	cmd.InheritedFlags().VisitAll(note)
	var firstErr error
	set := func(f *pflag.Flag) {
		if f.Changed || firstErr != nil || onLine[flagPartner(f.Name)] {
			return
		}
		if v, ok := os.LookupEnv(EnvName(f.Name)); ok {
			if err := f.Value.Set(v); err != nil {
				firstErr = &ExitError{Code: 2, Err: fmt.Errorf("environment variable %s=%q: %w", EnvName(f.Name), v, err)}
				return
			}
			f.Changed = true
			if f.Annotations == nil {
				f.Annotations = map[string][]string{}
			}
			f.Annotations[fromEnvAnnotation] = []string{EnvName(f.Name)}
		}
	}
	cmd.Flags().VisitAll(set)
	cmd.InheritedFlags().VisitAll(set)
	return firstErr
}

// fromEnvAnnotation marks a flag applyEnv set from its variable.
const fromEnvAnnotation = "payouts_from_env"

// flagPartner is the other flag of a pair of alternatives: --json for
// --output and --output for --json; NAME-file for NAME and NAME for
// NAME-file (a name without a partner gets one no flag has).
func flagPartner(name string) string {
	switch name {
	case "json":
		return "output"
	case "output":
		return "json"
	}
	if base, ok := strings.CutSuffix(name, "-file"); ok {
		return base
	}
	return name + "-file"
}

// givenAs is how the user gave flag name of c, for a message: "--NAME" on
// the command line, "PAYOUTS_NAME" in the environment; "" when it was not
// given (or c has no such flag).
func givenAs(c *cobra.Command, name string) string {
	f := c.Flags().Lookup(name)
	if f == nil || !f.Changed {
		return ""
	}
	if env, ok := f.Annotations[fromEnvAnnotation]; ok && len(env) == 1 {
		return env[0]
	}
	return "--" + name
}

// usageErrorArgs makes every command's argument check a usage error (exit
// 2), as flag errors are: `payouts reconcile --once extra` must not exit 1,
// which a reconciler's caller reads as "findings".
func usageErrorArgs(c *cobra.Command) {
	if c.HasParent() && c.HasSubCommands() && !c.Runnable() {
		// A group (serve, lock, ...): its help, or a usage error naming
		// what it does not have (cobra's own answer is the help, exit 0).
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
			}
			return cmd.Help()
		}
	}
	if check := c.Args; check != nil {
		c.Args = func(cmd *cobra.Command, args []string) error {
			if err := check(cmd, args); err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			return nil
		}
	}
	for _, sub := range c.Commands() {
		usageErrorArgs(sub)
	}
}

// oneArg is the argument check of a command that acts on one named thing
// (`payout show ID`, `lock revoke KEY`): exactly one, and not empty (an
// empty one would otherwise reach a server as a path of nothing).
func oneArg(cmd *cobra.Command, args []string) error {
	if err := cobra.ExactArgs(1)(cmd, args); err != nil {
		return err
	}
	if strings.TrimSpace(args[0]) == "" {
		name, _, _ := strings.Cut(strings.TrimPrefix(cmd.Use, cmd.Name()+" "), " ")
		return fmt.Errorf("%s is required: got an empty argument", name)
	}
	return nil
}
