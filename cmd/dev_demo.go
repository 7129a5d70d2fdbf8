package cmd

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/dev/demo"
	"github.com/payouts/payouts/executor"
)

func newDevDemoCmd(a *app) *cobra.Command {
	var (
		dir     string
		keep    bool
		freeze  string
		timeout time.Duration
	)
	c := &cobra.Command{
		Use:   "demo",
		Short: "Guided demo: a stale holder fenced out at the guards, ambiguous payouts resolved, nothing paid twice (exit 0 when the story held)",
		Long: `demo brings the local stack up (as dev up), loads fixture accounts and payouts, turns rail
faults on and runs executors. It freezes a holder (SIGSTOP) past its lease while it holds a
payout, lets another executor take the account over, thaws it and shows the guards fencing it
out; then it lets the reconciler resolve the ambiguous payouts and prints a summary.

Exit 0: the story held (0 duplicate payments at the rail, the ledger balanced, a fence fired,
every payout terminal or left ambiguous with a reason). Exit 1: it did not, and says why.
Exit 2: the demo could not run. The stack is stopped at the end (--keep leaves it running).

--freeze hook uses the executor's hold hook, compiled only into binaries built with
-tags crashpoints (make demo builds one); --freeze timing sends SIGSTOP at a moment the
executor has a payout in flight. auto picks hook when this binary has it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("log-level") {
				a.logLevel = "warn" // the story goes to stdout; the stack's chatter stays out of it
			}
			logger := a.logger(cmd, "dev")
			mode, err := freezeMode(freeze)
			if err != nil {
				return &ExitError{Code: 2, Err: err}
			}
			if timeout <= 0 {
				return &ExitError{Code: 2, Err: fmt.Errorf("--timeout must be positive")}
			}
			ctx := cmd.Context()
			if !keep {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			out := cmd.OutOrStdout()
			res, err := demo.Run(ctx, demo.Config{
				Dir: dir, Out: out, Terminal: isTerminal(out), Logger: logger, Keep: keep,
				Freeze: mode, HoldEnv: executor.HoldAfterEnv,
				HoldClaimed: string(executor.AfterClaimed), HoldSubmitting: string(executor.AfterSubmitting),
			})
			if err != nil {
				return &ExitError{Code: 2, Err: fmt.Errorf("the demo could not run: %w", err)}
			}
			if !res.Held {
				return &ExitError{Code: 1, Err: fmt.Errorf("the story did not hold: %s", strings.Join(res.Reasons, "; "))}
			}
			return nil
		},
	}
	c.Flags().StringVar(&dir, "dir", ".dev/demo", "directory for the stack's data and logs (a previous demo's directory is wiped first)")
	c.Flags().BoolVar(&keep, "keep", false, "leave the stack running after the summary (Ctrl-C stops it)")
	c.Flags().StringVar(&freeze, "freeze", "auto", "how to freeze a holder mid-payout: hook (needs -tags crashpoints), timing, or auto")
	c.Flags().DurationVar(&timeout, "timeout", 8*time.Minute, "give up (exit 2) after this long")
	return c
}

// freezeMode resolves --freeze against what this binary was built with.
func freezeMode(v string) (demo.FreezeMode, error) {
	switch v {
	case "auto":
		if demoHoldHook {
			return demo.FreezeByHook, nil
		}
		return demo.FreezeByTiming, nil
	case "hook":
		if !demoHoldHook {
			return "", fmt.Errorf("--freeze hook: this binary was built without -tags crashpoints (use make demo, or --freeze timing)")
		}
		return demo.FreezeByHook, nil
	case "timing":
		return demo.FreezeByTiming, nil
	}
	return "", fmt.Errorf("--freeze %q: want hook, timing or auto", v)
}

// isTerminal reports whether w is a character device (a terminal), where
// the progress line is redrawn in place.
func isTerminal(w any) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
