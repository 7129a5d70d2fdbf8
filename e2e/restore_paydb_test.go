package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/proctest"
	"github.com/payouts/payouts/dev/stack"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
	"github.com/payouts/payouts/migrations"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// startPaymentOn starts a payment resource on the stack's payment address
// against payDB (after st.StopRole("payment", ...)).
func (s *system) startPaymentOn(t *testing.T, name, payDB string) *proctest.Proc {
	t.Helper()
	r := s.st.Ready
	p := proctest.Start(t, name, nil, "serve", "payment", "--listen", hostPort(t, r.PaymentURL),
		"--auth-file", filepath.Join(r.Dir, "auth.json"), "--database-url", payDB)
	if err := proctest.WaitReady(ctxT(t, time.Minute), r.PaymentURL); err != nil {
		t.Fatalf("%v\n%s", err, p.Log())
	}
	return p
}

// highWater is the proxy's high-water for account (0 when it has none).
func (s *system) highWater(t *testing.T, account string) fencing.Token {
	t.Helper()
	after := ""
	for {
		page, err := s.proxy.HighWater(ctxT(t, 30*time.Second), after, 1000)
		if err != nil {
			t.Fatalf("proxy high-water: %v", err)
		}
		for _, hw := range page.Items {
			if hw.AccountID == account {
				return hw.Token
			}
		}
		if page.Next == "" || len(page.Items) == 0 {
			return 0
		}
		after = page.Next
	}
}

// TestRestorePayDBFromBaseBackup is the two-guard claim end to end (INV-04,
// INV-05). paydb, in a cluster of its own, is restored from a base backup
// taken before the last grants: its fences go back. A holder whose grant
// is older than the last one the guards saw — stale — then passes the
// payment guard, but the proxy's high-water, which was not rewound, stops
// it before the rail. The reconciler reports the rewound fence (the
// proxy's high-water above paydb's fence), and once a live holder takes
// over every payout completes, each paid once.
func TestRestorePayDBFromBaseBackup(t *testing.T) {
	if testing.Short() {
		t.Skip("whole-system test")
	}
	// Every payout must end POSTED and no rail timeout is under test.
	s := startSystem(t, stack.Options{SettlementWindow: time.Second, RailTimeout: steadyRailTimeout})
	r := s.st.Ready
	ctx := ctxT(t, 10*time.Minute)

	payPG, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(t.TempDir(), "paypg"), Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := payPG.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = payPG.Stop() })
	if err := payPG.CreateDatabase(ctx, "paydb", ""); err != nil {
		t.Fatal(err)
	}
	payDB := payPG.URL("paydb")
	if err := migrations.Apply(ctx, migrations.PayDB, payDB); err != nil {
		t.Fatal(err)
	}
	s.st.StopRole("payment", 20*time.Second)
	payProc := s.startPaymentOn(t, "payment-own", payDB)

	const account = "rp-a"
	key := fencing.Key(account)
	s.createAccount(t, account, 10_000_000)
	ex := s.startExecutor(t, "rp-executor-1", nil)
	s.createPayout(t, "rp-0", account, 100, "BEN-rp")
	s.waitPayoutState(t, "rp-0", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)
	s.createPayout(t, "rp-1", account, 100, "BEN-rp")

	// The backup: paydb as it is now (rp-1 PENDING, the fence of rp-0's grant).
	backup := filepath.Join(payPG.Dir(), "basebackup")
	if err := payPG.BaseBackup(ctx, backup); err != nil {
		t.Fatal(err)
	}
	acc, err := s.pay.Account(ctx, account)
	if err != nil {
		t.Fatal(err)
	}
	backupFence := acc.FenceToken

	// The grant that will be stale: taken and released. Then a later grant
	// (the executor's) pays rp-1; both guards store its token.
	sess, err := lockclient.Open(ctx, r.LockURL, "rp-stale", lockclient.WithToken(r.Tokens.Executor))
	if err != nil {
		t.Fatal(err)
	}
	stale, err := sess.Acquire(ctx, key, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Release(ctx, stale); err != nil {
		t.Fatal(err)
	}
	if err := sess.Close(ctx); err != nil {
		t.Fatal(err)
	}
	ex = s.startExecutor(t, "rp-executor-2", nil)
	s.waitPayoutState(t, "rp-1", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)
	hw := s.highWater(t, account)
	if stale.Token <= backupFence || hw <= stale.Token {
		t.Fatalf("tokens out of order: backup fence %d, stale grant %d, proxy high-water %d", backupFence, stale.Token, hw)
	}

	// Restore paydb from the backup.
	stopProc(t, payProc)
	if err := payPG.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(payPG.DataDir()); err != nil {
		t.Fatal(err)
	}
	// pg_basebackup ran as the server user, so the copy is already its own.
	if err := os.Rename(backup, payPG.DataDir()); err != nil {
		t.Fatal(err)
	}
	if err := payPG.Start(ctx); err != nil {
		t.Fatal(err)
	}
	s.startPaymentOn(t, "payment-restored", payDB)
	if acc, err = s.pay.Account(ctx, account); err != nil {
		t.Fatal(err)
	}
	if acc.FenceToken != backupFence {
		t.Fatalf("restored paydb's fence %d, want the backup's %d", acc.FenceToken, backupFence)
	}
	if p := s.payout(t, "rp-1"); p.State != pc.Pending {
		t.Fatalf("restored rp-1 is %s, want PENDING as at the backup", p.State)
	}

	// The stale holder: passes the rewound payment guard...
	p2 := s.createPayout(t, "rp-2", account, 100, "BEN-rp")
	pay, err := pc.New(r.PaymentURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	proxy, err := proxyclient.New(r.ProxyURL, r.Tokens.Executor)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := pay.Claim(ctx, p2.ID, stale.Token, stale.Holder()); err != nil || p.State != pc.Claimed {
		t.Fatalf("stale claim at the rewound payment resource: %v (%s), want it to pass guard 1", err, p.State)
	}
	if p, err := pay.Submitting(ctx, p2.ID, stale.Token, stale.Holder()); err != nil || p.State != pc.RailSubmitted {
		t.Fatalf("stale submitting at the rewound payment resource: %v (%s), want it to pass guard 1", err, p.State)
	}
	// ...and the proxy's high-water stops it before the rail.
	_, err = proxy.Submit(ctx, proxyclient.Submission{PayoutID: p2.ID, AccountID: account, ClientRef: p2.ClientRef,
		Amount: p2.Amount, Currency: p2.Currency, BeneficiaryRef: p2.BeneficiaryRef}, stale.Token, stale.Holder())
	if pe := problem.From(err); !problem.Has(err, problem.FencedOut) || pe == nil || pe.StoredToken != int64(hw) {
		t.Fatalf("stale submission at the proxy: %v, want fenced_out against high-water %d", err, hw)
	}
	if items := s.railPayments(t)[p2.ClientRef]; len(items) != 0 {
		t.Fatalf("the stale holder reached the rail: %+v", items)
	}
	out, log, code := s.reconcileOnce(t, "--json")
	if code != 1 || !hasFinding(out, "INV-04", "high_water_above_fence") {
		t.Fatalf("reconcile after the paydb restore: exit %d, want 1 with an INV-04 high_water_above_fence finding\n%s", code, log)
	}
	for _, f := range out.Findings {
		if f.Check == "high_water_above_fence" {
			if f.Objects["account_id"] != account || f.Objects["high_water"] != float64(hw) || f.Objects["paydb_fence"] != float64(stale.Token) {
				t.Fatalf("high_water_above_fence names %v, want account %s, high-water %d above paydb fence %d", f.Objects, account, hw, stale.Token)
			}
		}
	}

	// A live holder takes over: rp-1 (paid at the rail before the restore)
	// is resolved from the proxy's record, never resent; rp-2 (only a
	// FENCED attempt, never forwarded) is submitted now.
	ex = s.startExecutor(t, "rp-executor-3", nil)
	s.waitPayoutState(t, "rp-1", 2*time.Minute, pc.Posted)
	s.waitPayoutState(t, "rp-2", 2*time.Minute, pc.Posted)
	stopExecutor(t, ex)
	s.checkMoney(t, s.payouts(t, account), map[string]int64{account: 10_000_000})
	out, log, code = s.reconcileOnce(t, "--json")
	if code == 2 || hasFinding(out, "INV-04", "high_water_above_fence") {
		t.Fatalf("reconcile after a live holder took over: exit %d, still reports the rewound fence\n%s", code, log)
	}
}
