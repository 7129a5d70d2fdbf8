package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/dev/supervise"
	"github.com/payouts/payouts/reconcile"
)

// startExecutor runs `payouts run executor` as a child of the stack, with
// the hold hook armed at hold ("" for none).
func (dm *demo) startExecutor(name string, concurrency int, hold string) error {
	r := dm.st.Ready
	args := []string{"run", "executor", "--owner", name, "--concurrency", strconv.Itoa(concurrency),
		"--session-ttl", dm.cfg.SessionTTL.String(), "--poll-interval", "200ms",
		"--lock-url", r.LockURL, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL,
		"--token-file", r.TokenFiles["executor"]}
	args = append(args, caArgs(r)...)
	var env []string
	if dm.cfg.HoldEnv != "" {
		// Armed (or, with "", disarmed) for this one child only.
		env = append(env, dm.cfg.HoldEnv+"="+hold)
	}
	p, err := dm.st.StartRole(name, env, args...)
	if err != nil {
		return err
	}
	dm.procs[name] = p
	return nil
}

func (dm *demo) signal(name string, sig syscall.Signal) error {
	p := dm.procs[name]
	if p == nil {
		return fmt.Errorf("no process %s", name)
	}
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("%s to %s (pid %d): %w", sig, name, p.Pid(), err)
	}
	return nil
}

// waitFor polls check until it reports done, ctx ends or timeout passes.
// Timeouts are generous: this runs on loaded machines.
func waitFor(ctx context.Context, timeout, every time.Duration, what string, check func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		done, err := check()
		if done {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			if last != nil {
				return fmt.Errorf("gave up after %s waiting for %s: %w", timeout, what, last)
			}
			return fmt.Errorf("gave up after %s waiting for %s", timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, context.Cause(ctx))
		case <-time.After(every):
		}
	}
}

// pause waits d unless ctx ends first (the demo waits out documented
// windows: a lease TTL, the rail's settlement window).
func pause(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-time.After(d):
		return nil
	}
}

func callCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 30*time.Second)
}

// reconcile runs `payouts reconcile --once --json` as a child process and
// returns its report and exit code. Exit 2 (could not run) is an error.
func (dm *demo) reconcile(ctx context.Context, pass int) (*reconcile.Report, int, error) {
	r := dm.st.Ready
	name := fmt.Sprintf("reconcile-%d", pass)
	logPath := filepath.Join(r.Dir, "logs", name+".log")
	reportPath := filepath.Join(r.Dir, "logs", name+".json")
	p, err := supervise.Start(supervise.Spec{Name: name, Path: dm.cfg.Binary, Log: logPath, Stdout: reportPath,
		Args: append([]string{"reconcile", "--once", "--json",
			"--lock-url", r.LockURL, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL, "--rail-url", r.RailURL,
			// Every credential used at the rail is given explicitly: a
			// reconciler-role one for lookups, the operator's for the
			// settlement report (an operator's right there).
			"--token-file", r.TokenFiles["reconciler"], "--rail-token-file", r.TokenFiles["reconciler"],
			"--rail-report-token-file", r.TokenFiles["operator"], "--owner", "demo-" + name,
			"--settlement-window", dm.cfg.SettlementWindow.String(), "--ambiguity-sla", "1h", "--max-findings", "100000"}, caArgs(r)...)})
	if err != nil {
		return nil, 0, fmt.Errorf("run the reconciler: %w", err)
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Stop(10 * time.Second)
		return nil, 0, fmt.Errorf("the reconciler: %w", context.Cause(ctx))
	}
	code, err := p.Wait(0)
	if err != nil {
		return nil, 0, fmt.Errorf("run the reconciler: %w", err)
	}
	rep := &reconcile.Report{}
	b, _ := os.ReadFile(reportPath)
	if code == reconcile.ExitCannotRun || json.Unmarshal(b, rep) != nil {
		return nil, code, fmt.Errorf("the reconciler could not run (exit %d); see %s", code, logPath)
	}
	return rep, code, nil
}

// caArgs makes a client child trust the stack's throwaway CA, if it has one.
func caArgs(r stack.Ready) []string {
	if r.TLS == nil {
		return nil
	}
	return []string{"--ca-file", r.TLS.CA}
}
