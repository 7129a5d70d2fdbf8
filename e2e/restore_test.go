package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// startPGLock starts a lock service on the PostgreSQL backend at the
// stack's lock address (after st.StopRole("lock", ...)).
func (s *system) startPGLock(t *testing.T, name, lockDB string) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	p := proctest.Start(t, name, nil, "serve", "lock", "--listen", hostPort(t, r.LockURL),
		"--auth-file", filepath.Join(r.Dir, "auth.json"), "--backend", "postgres", "--database-url", lockDB)
	if err := proctest.WaitReady(ctxT(t, time.Minute), r.LockURL); err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// stopProc sends SIGTERM and waits for the process to be gone.
func stopProc(t *testing.T, p *proctest.Proc) {
	t.Helper()
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s: %v", p.Name, err)
	}
	if _, err := p.Wait(time.Minute); err != nil {
		p.Kill()
	}
}

func hasFinding(out reconcileOut, invariant, check string) bool {
	for _, f := range out.Findings {
		if f.Invariant == invariant && f.Check == check {
			return true
		}
	}
	return false
}

// TestRestoreLockDBFromBaseBackup is DESIGN §5 "Restore" and D-13 for the
// PostgreSQL lock backend. lockdb lives in a cluster of its own (fsync on),
// so restoring it rewinds the lock service only, never paydb or proxydb.
//
// Without D-13 the restored token sequence re-issues tokens below what the
// guards store: every write is fenced out, nothing is paid twice, and the
// reconciler reports the regression with the highest fence. With D-13
// (`payouts lock bump-tokens --to <highest fence>`) new grants are above
// every fence and the waiting payouts complete.
func TestRestoreLockDBFromBaseBackup(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	s := startSystem(t, stack.Options{SettlementWindow: time.Second, RailTimeout: time.Second})
	ctx := ctxT(t, 5*time.Minute)

	lockPG, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(t.TempDir(), "lockpg"), Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := lockPG.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lockPG.Stop() })
	if err := lockPG.CreateDatabase(ctx, "lockdb", ""); err != nil {
		t.Fatal(err)
	}
	lockDB := lockPG.URL("lockdb")
	if err := migrations.Apply(ctx, migrations.LockDB, lockDB); err != nil {
		t.Fatal(err)
	}
	s.st.StopRole("lock", 20*time.Second)
	lockProc := s.startPGLock(t, "lock-pg", lockDB)

	const account = "rs-a"
	s.createAccount(t, account, 10_000_000)
	ex := s.startExecutor(t, "rs-executor", nil)
	for i := 0; i < 2; i++ {
		s.createPayout(t, fmt.Sprintf("rs-before-%d", i), account, 100, "BEN-rs")
	}
	for i := 0; i < 2; i++ {
		s.waitPayoutState(t, fmt.Sprintf("rs-before-%d", i), 2*time.Minute, pc.Posted)
	}

	// The backup: a consistent copy of lockdb as it is now.
	backup := filepath.Join(lockPG.Dir(), "basebackup")
	if err := lockPG.BaseBackup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	backupHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}

	// Tokens advance well past the backup: payouts under new grants, then a
	// jump of the live sequence (as months of grants would), then more
	// payouts whose fences the guards store. The jump keeps the gap larger
	// than what a fenced-out executor, which takes a fresh grant on each
	// retry, could climb through during the test.
	for i := 0; i < 2; i++ {
		s.createPayout(t, fmt.Sprintf("rs-between-%d", i), account, 100, "BEN-rs")
	}
	for i := 0; i < 2; i++ {
		s.waitPayoutState(t, fmt.Sprintf("rs-between-%d", i), 2*time.Minute, pc.Posted)
	}
	const advance = 1_000_000
	if _, errOut, code := runCLI(t, nil, "lock", "bump-tokens", "--to", strconv.Itoa(advance), "--database-url", lockDB); code != 0 {
		t.Fatalf("advance the live token sequence: exit %d: %s", code, errOut)
	}
	for i := 0; i < 2; i++ {
		s.createPayout(t, fmt.Sprintf("rs-after-backup-%d", i), account, 100, "BEN-rs")
	}
	for i := 0; i < 2; i++ {
		s.waitPayoutState(t, fmt.Sprintf("rs-after-backup-%d", i), 2*time.Minute, pc.Posted)
	}
	payHigh, err := s.pay.HighFence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	proxyHigh, err := s.proxy.HighFence(ctx)
	if err != nil {
		t.Fatal(err)
	}
	highest := max(payHigh, proxyHigh)
	if highest <= advance {
		t.Fatalf("guards' highest fence %d (paydb %d, proxy %d), want above %d", highest, payHigh, proxyHigh, advance)
	}
	if n := len(s.paySafetyEvents(t)) + len(s.proxySafetyEvents(t)); n != 0 {
		t.Fatalf("%d safety events before the restore, want none", n)
	}

	// Restore lockdb from the backup: stop the lock service and the cluster,
	// replace the data directory, start both again. The executor keeps running.
	stopProc(t, lockProc)
	if err := lockPG.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(lockPG.DataDir()); err != nil {
		t.Fatal(err)
	}
	// pg_basebackup ran as the server user, so the copy is already its own.
	if err := os.Rename(backup, lockPG.DataDir()); err != nil {
		t.Fatal(err)
	}
	if err := lockPG.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s.startPGLock(t, "lock-pg-restored", lockDB)
	restoredHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if restoredHigh >= highest || restoredHigh < backupHigh {
		t.Fatalf("after the restore the lock service's high token is %d; want the backup's (%d) or a little above, below the fences (%d)",
			restoredHigh, backupHigh, highest)
	}

	// Without D-13: every write under a re-issued (lower) token is fenced out.
	for i := 0; i < 2; i++ {
		s.createPayout(t, fmt.Sprintf("rs-restored-%d", i), account, 100, "BEN-rs")
	}
	key := fencing.Key(account)
	var fenced int
	waitUntil(t, 2*time.Minute, "the guards to fence out the restored lock service's tokens", func() (bool, error) {
		fenced = 0
		for _, e := range s.paySafetyEvents(t) {
			if e.Kind == pc.KindFencedOut && e.Key == key && e.PresentedToken < e.StoredToken && e.StoredToken > advance {
				fenced++
			}
		}
		if fenced < 3 {
			return false, fmt.Errorf("%d fenced_out events on %s", fenced, key)
		}
		return true, nil
	})
	for i := 0; i < 2; i++ {
		if p := s.payout(t, fmt.Sprintf("rs-restored-%d", i)); p.State != pc.Pending {
			t.Fatalf("payout %s is %s under a rewound lock service; want PENDING (fenced out)", p.ID, p.State)
		}
	}
	for ref, items := range s.railPayments(t) {
		if len(items) > 1 {
			t.Fatalf("client reference %s paid %d times at the rail", ref, len(items))
		}
	}
	out, log, code := s.reconcileOnce(t, "--json")
	if code != 1 || !hasFinding(out, "INV-04", "lock_service_rewound") {
		t.Fatalf("reconcile after the restore: exit %d, want 1 with an INV-04 lock_service_rewound finding\n%s", code, log)
	}
	if out.HighestFence != int64(highest) || out.LockHighToken >= out.HighestFence {
		t.Fatalf("reconcile printed highest_fence %d, lock_high_token %d; want %d and below it", out.HighestFence, out.LockHighToken, highest)
	}
	if !hasFinding(out, "INV-05", "fenced_out") {
		t.Fatalf("reconcile does not report the fenced_out events:\n%s", log)
	}

	// D-13: bump the token sequence to the highest fence the reconciler printed.
	stdout, errOut, code := runCLI(t, nil, "lock", "bump-tokens", "--to", strconv.FormatInt(out.HighestFence, 10),
		"--database-url", lockDB, "--output", "json")
	if code != 0 {
		t.Fatalf("bump-tokens: exit %d: %s", code, errOut)
	}
	var bumped struct {
		From int64 `json:"from"`
		To   int64 `json:"to"`
	}
	if err := json.Unmarshal([]byte(stdout), &bumped); err != nil || bumped.To != out.HighestFence || bumped.From >= bumped.To {
		t.Fatalf("bump-tokens printed %q (%v)", stdout, err)
	}
	for i := 0; i < 2; i++ {
		s.waitPayoutState(t, fmt.Sprintf("rs-restored-%d", i), 2*time.Minute, pc.Posted)
	}
	s.createPayout(t, "rs-bumped", account, 100, "BEN-rs")
	s.waitPayoutState(t, "rs-bumped", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)

	lockHigh, err := s.lock.HighToken(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if lockHigh <= highest {
		t.Fatalf("lock service high token %d after bump-tokens, want above %d", lockHigh, highest)
	}
	all := s.payouts(t, account)
	s.checkMoney(t, all, map[string]int64{account: 10_000_000})
	out, log, code = s.reconcileOnce(t, "--json")
	if code == 2 || hasFinding(out, "INV-04", "lock_service_rewound") || hasFinding(out, "INV-04", "token_regression") ||
		hasFinding(out, "INV-04", "high_water_above_fence") {
		t.Fatalf("reconcile after bump-tokens: exit %d, still reports a token regression\n%s", code, log)
	}
	if out.LockHighToken < out.HighestFence {
		t.Fatalf("after bump-tokens lock_high_token %d < highest_fence %d", out.LockHighToken, out.HighestFence)
	}
	// The fenced-out attempts stay on record as evidence.
	if !hasFinding(out, "INV-05", "fenced_out") {
		t.Fatalf("the fenced_out evidence disappeared:\n%s", log)
	}
	// The grants issued between the backup and the restore are gone from
	// the restored grant log, so the writes made under them stay reported
	// as without a grant (INV-07). Nothing written under a later token may be.
	for _, f := range out.Findings {
		switch f.Check {
		case "fenced_out":
		case "ledger_without_grant", "submission_without_grant":
			tok, _ := f.Objects["token"].(float64)
			if tok <= float64(backupHigh) || tok > float64(highest) {
				t.Errorf("finding for a token outside the lost grants (%d, %d]: %+v", backupHigh, highest, f)
			}
		default:
			t.Errorf("unexpected finding after bump-tokens: %+v", f)
		}
	}
}
