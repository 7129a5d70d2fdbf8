// Package demo is the guided demo behind `payouts dev demo`: it brings
// the local stack up, loads fixtures, runs executors against a faulty rail,
// freezes one holder past its lease so the guards fence it out (UC-03),
// lets the reconciler resolve the ambiguous payouts, and checks that
// nothing was paid twice and the ledger balances.
//
// It talks to the roles only through their client packages and runs the
// executors and the reconciler as child processes of the same binary.
package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/dev/supervise"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/lock/lockclient"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// FreezeMode is how UC-03 freezes a holder in the middle of its work.
type FreezeMode string

const (
	// FreezeByHook uses the executor's hold hook (binaries built with
	// -tags crashpoints): the executor stops right after a step and, once
	// thawed, writes WITHOUT its client-side lease check — exactly a
	// process paused between its check and its write. Both guards fire.
	FreezeByHook FreezeMode = "hook"
	// FreezeByTiming (ordinary builds) sends SIGSTOP while the executor
	// holds a grant with a payout in flight. A thawed executor usually
	// notices its lease is gone before it writes; if it does, the demo
	// presents the frozen holder's token itself, as the executor would
	// have had it been paused one instruction later.
	FreezeByTiming FreezeMode = "timing"
)

// Config configures one run of the demo.
type Config struct {
	// Dir holds the stack's data and logs. A directory left by an earlier
	// demo (it has a marker file) is wiped first; any other non-empty
	// directory is refused.
	Dir string
	// Binary is the payouts executable (default: this process's).
	Binary string
	// Out receives the story; Terminal redraws the progress line in place.
	Out      io.Writer
	Terminal bool
	// Logger receives the stack's own log lines (stderr).
	Logger *slog.Logger
	// Freeze selects how UC-03 freezes its holders.
	Freeze FreezeMode
	// HoldEnv is the executor's hold-hook environment variable and
	// HoldClaimed/HoldSubmitting its two points used here (FreezeByHook).
	HoldEnv, HoldClaimed, HoldSubmitting string
	// Keep leaves the stack running after the summary until ctx is done.
	Keep bool

	Accounts         int           // fixture accounts (default 10)
	Payouts          int           // fixture payouts (default 60)
	SettlementWindow time.Duration // the rail's settlement window (default 3s)
	RailTimeout      time.Duration // the proxy's rail timeout (default 1s)
	SessionTTL       time.Duration // executors' lock session TTL (default 3s)
}

func (c *Config) defaults() error {
	if c.Dir == "" {
		return errors.New("demo: --dir is required")
	}
	if c.Out == nil {
		c.Out = os.Stdout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if c.Binary == "" {
		b, err := os.Executable()
		if err != nil {
			return err
		}
		c.Binary = b
	}
	switch c.Freeze {
	case FreezeByHook:
		if c.HoldEnv == "" || c.HoldClaimed == "" || c.HoldSubmitting == "" {
			return errors.New("demo: freezing by hook needs the executor's hold hook variable and points")
		}
	case FreezeByTiming:
	default:
		return fmt.Errorf("demo: freeze mode %q: want %q or %q", c.Freeze, FreezeByHook, FreezeByTiming)
	}
	if c.Accounts <= 0 {
		c.Accounts = 10
	}
	if c.Payouts <= 0 {
		c.Payouts = 60
	}
	if c.SettlementWindow <= 0 {
		c.SettlementWindow = 3 * time.Second
	}
	if c.RailTimeout <= 0 {
		c.RailTimeout = time.Second
	}
	if c.SessionTTL <= 0 {
		c.SessionTTL = 3 * time.Second
	}
	return nil
}

// Result is the verdict of one run.
type Result struct {
	// Held is true when the story held: nothing paid twice, the ledger
	// balanced, a fence fired, every payout terminal or left ambiguous
	// with a reason.
	Held bool
	// Reasons say why it did not hold.
	Reasons []string
	// Summary is what the closing summary reported.
	Summary Summary
}

// Summary is the closing summary.
type Summary struct {
	FinalStates       map[pc.State]int
	FencedOut         map[string]int // per guard: payment, proxy
	AmbiguousSeen     int
	AmbiguousResolved int
	Resolutions       map[string]int // SETTLED / ABSENT
	RailDuplicates    int
	BalanceSum        int64
	LedgerFindings    []string // the reconciler's INV-03 findings
	ReconcileExit     int
	ReconcileFindings map[string]int
	FreezeMode        FreezeMode
	Replayed          bool // the demo presented the stale token itself
}

// markerFile marks a directory the demo created (and may wipe).
const markerFile = ".payouts-demo"

// prepareDir makes Dir empty and marked.
func prepareDir(dir string) error {
	entries, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	case len(entries) == 0:
	default:
		if _, err := os.Stat(filepath.Join(dir, markerFile)); err != nil {
			return fmt.Errorf("--dir %s is not empty and was not made by `payouts dev demo`; choose another directory or remove it", dir)
		}
		if err := os.RemoveAll(dir); err != nil {
			return fmt.Errorf("wipe the previous demo in %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, markerFile), []byte("made by payouts dev demo; wiped by the next run\n"), 0o644)
}

// demo is one run in progress.
type demo struct {
	cfg   Config
	st    *stack.Stack
	d     *display
	pay   *pc.Client // operator
	proxy *proxyclient.Client
	rail  *railclient.Client
	lock  *lockclient.Client
	procs map[string]*supervise.Proc
	sum   Summary
	fails []string
}

// Run runs the demo. An error means it could not run (the stack did not
// come up, a service stopped answering, ctx ended); a story that ran but
// did not hold is a Result with Held false.
func Run(ctx context.Context, cfg Config) (Result, error) {
	if err := cfg.defaults(); err != nil {
		return Result{}, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return Result{}, err
	}
	cfg.Dir = dir
	if err := prepareDir(dir); err != nil {
		return Result{}, err
	}
	dm := &demo{cfg: cfg, d: newDisplay(cfg.Out, cfg.Terminal), procs: map[string]*supervise.Proc{},
		sum: Summary{FencedOut: map[string]int{}, Resolutions: map[string]int{}, FreezeMode: cfg.Freeze}}
	dm.d.Printf("payouts dev demo: a stale holder fenced out, nothing paid twice (data and logs in %s)", dir)

	dm.d.Step(0, "Bringing the stack up: PostgreSQL, embedded etcd, lock service, payment resource, rail proxy, rail stub")
	st, err := stack.Start(ctx, stack.Options{Dir: dir, Binary: cfg.Binary, Logger: cfg.Logger,
		SettlementWindow: cfg.SettlementWindow, RailTimeout: cfg.RailTimeout})
	if err != nil {
		return Result{}, fmt.Errorf("start the stack: %w", err)
	}
	dm.st = st
	defer func() {
		if cfg.Keep && ctx.Err() == nil {
			dm.keep(ctx)
		}
		dm.d.Printf("\nstopping the stack (logs stay in %s)", filepath.Join(dir, "logs"))
		if err := st.Stop(); err != nil {
			dm.d.Printf("stopping the stack: %v", err)
		}
	}()
	r := st.Ready
	dm.d.Printf("  lock %s  payment %s  proxy %s  rail %s", r.LockURL, r.PaymentURL, r.ProxyURL, r.RailURL)
	if err := dm.clients(); err != nil {
		return Result{}, err
	}

	// Any essential role exiting ends the run.
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		select {
		case err := <-st.Failed():
			cancel(err)
		case <-runCtx.Done():
		}
	}()
	if err := dm.story(runCtx); err != nil {
		if cause := context.Cause(runCtx); cause != nil && !errors.Is(cause, context.Canceled) {
			err = fmt.Errorf("%w (%v)", err, cause)
		}
		return Result{Summary: dm.sum}, err
	}
	res := Result{Held: len(dm.fails) == 0, Reasons: dm.fails, Summary: dm.sum}
	if res.Held {
		dm.d.Printf("\nThe story held: a stale holder was fenced out, nothing was paid twice and the ledger balances.")
	} else {
		dm.d.Printf("\nThe story did NOT hold:")
		for _, why := range res.Reasons {
			dm.d.Printf("  - %s", why)
		}
		dm.d.Printf("Logs of every role: %s", filepath.Join(dir, "logs"))
	}
	return res, nil
}

func (dm *demo) clients() error {
	r := dm.st.Ready
	hc, err := r.HTTPClient()
	if err != nil {
		return err
	}
	with := httpx.WithHTTPClient(hc)
	if dm.pay, err = pc.New(r.PaymentURL, r.Tokens.Operator, with); err != nil {
		return err
	}
	// The stale writes the demo presents are an executor's: only executors submit.
	if dm.proxy, err = proxyclient.New(r.ProxyURL, r.Tokens.Executor, with); err != nil {
		return err
	}
	if dm.rail, err = railclient.New(r.RailURL, r.Tokens.Operator, with); err != nil {
		return err
	}
	dm.lock, err = lockclient.New(r.LockURL, lockclient.WithToken(r.Tokens.Operator), lockclient.WithHTTPClient(hc))
	return err
}

func (dm *demo) fail(format string, args ...any) {
	dm.fails = append(dm.fails, fmt.Sprintf(format, args...))
}

// keep leaves the stack running until ctx ends (Ctrl-C).
func (dm *demo) keep(ctx context.Context) {
	r := dm.st.Ready
	dm.d.Printf("\n--keep: the stack keeps running; Ctrl-C stops it.")
	dm.d.Printf("  payment %s  proxy %s  lock %s  rail %s", r.PaymentURL, r.ProxyURL, r.LockURL, r.RailURL)
	dm.d.Printf("  operator token in %s", r.TokenFiles["operator"])
	dm.d.Printf("  try: curl -s -H \"Authorization: Bearer $(cat %s)\" '%s/v1/payouts?state=POSTED'", r.TokenFiles["operator"], r.PaymentURL)
	select {
	case <-ctx.Done():
	case err := <-dm.st.Failed():
		dm.d.Printf("a role exited: %v", err)
	}
}
