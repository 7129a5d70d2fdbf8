package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// payout reads one payout.
func (dm *demo) payout(ctx context.Context, id string) (pc.Payout, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	p, err := dm.pay.Payout(cctx, id)
	if err != nil {
		return p, fmt.Errorf("read payout %s: %w", id, err)
	}
	return p, nil
}

// payoutsOf lists every payout, or those of one account.
func (dm *demo) payoutsOf(ctx context.Context, account string) ([]pc.Payout, error) {
	return dm.list(ctx, pc.PayoutFilter{AccountID: account, Limit: 1000})
}

// payoutsIn lists every payout in state s.
func (dm *demo) payoutsIn(ctx context.Context, s pc.State) ([]pc.Payout, error) {
	return dm.list(ctx, pc.PayoutFilter{State: s, Limit: 1000})
}

func (dm *demo) list(ctx context.Context, f pc.PayoutFilter) ([]pc.Payout, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var out []pc.Payout
	for {
		page, err := dm.pay.Payouts(cctx, f)
		if err != nil {
			return nil, fmt.Errorf("list payouts: %w", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		f.After = page.Next
	}
}

// counts is the number of payouts in each state.
func (dm *demo) counts(ctx context.Context) (map[pc.State]int, error) {
	all, err := dm.payoutsOf(ctx, "")
	if err != nil {
		return nil, err
	}
	c := map[pc.State]int{}
	for _, p := range all {
		c[p.State]++
	}
	return c, nil
}

// accounts lists every account, the system ones (funding, clearing)
// included.
func (dm *demo) accounts(ctx context.Context) ([]pc.Account, error) {
	cctx, cancel := callCtx(ctx)
	defer cancel()
	var out []pc.Account
	after := ""
	for {
		page, err := dm.pay.Accounts(cctx, after, 1000)
		if err != nil {
			return nil, fmt.Errorf("list accounts: %w", err)
		}
		out = append(out, page.Items...)
		if page.Next == "" || len(page.Items) == 0 {
			return out, nil
		}
		after = page.Next
	}
}

// reconcileReport is the part of `payouts reconcile --json` the demo reads.
type reconcileReport struct {
	Findings []struct {
		Invariant string `json:"invariant"`
		Check     string `json:"check"`
		Evidence  string `json:"evidence"`
	} `json:"findings"`
	Resolved []struct {
		PayoutID   string `json:"payout_id"`
		Resolution string `json:"resolution"`
		State      string `json:"state"`
		Token      int64  `json:"token"`
	} `json:"resolved"`
	Unresolved []struct {
		PayoutID string `json:"payout_id"`
		Reason   string `json:"reason"`
	} `json:"unresolved"`
	Truncated int `json:"truncated"`
}

// reconcile runs `payouts reconcile --once --json` as a child process and
// returns its report and exit code. Exit 2 (could not run) is an error.
func (dm *demo) reconcile(ctx context.Context, pass int) (reconcileReport, int, error) {
	r := dm.st.Ready
	logPath := filepath.Join(r.Dir, "logs", fmt.Sprintf("reconcile-%d.log", pass))
	logFile, err := os.Create(logPath)
	if err != nil {
		return reconcileReport{}, 0, err
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, dm.cfg.Binary, "reconcile", "--once", "--json",
		"--lock-url", r.LockURL, "--payment-url", r.PaymentURL, "--proxy-url", r.ProxyURL, "--rail-url", r.RailURL,
		"--token", r.Tokens.Reconciler, "--rail-token", r.Tokens.Operator, "--owner", fmt.Sprintf("demo-reconciler-%d", pass),
		"--settlement-window", dm.cfg.SettlementWindow.String(), "--ambiguity-sla", "1h", "--max-findings", "100000")
	var stdout bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	err = cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		return reconcileReport{}, 0, fmt.Errorf("run the reconciler: %w", err)
	}
	var rep reconcileReport
	if code == 2 || json.Unmarshal(stdout.Bytes(), &rep) != nil {
		b, _ := os.ReadFile(logPath)
		return rep, code, fmt.Errorf("the reconciler could not run (exit %d); %s:\n%s", code, logPath, lastLines(string(b), 15))
	}
	return rep, code, nil
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
