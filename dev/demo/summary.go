package demo

import (
	"context"
	"fmt"
	"sort"
	"strings"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// summary runs the final reconciliation and checks the story.
func (dm *demo) summary(ctx context.Context) error {
	dm.d.Step(4, "Summary")
	rep, code, err := dm.reconcile(ctx, 99)
	if err != nil {
		return err
	}
	dm.sum.ReconcileExit = code
	dm.sum.ReconcileFindings = map[string]int{}
	for _, f := range rep.Findings {
		dm.sum.ReconcileFindings[f.Check]++
		if f.Invariant == "INV-03" {
			dm.sum.LedgerFindings = append(dm.sum.LedgerFindings, f.Check+": "+f.Evidence)
		}
	}
	unresolved := map[string]string{}
	for _, u := range rep.Unresolved {
		unresolved[u.PayoutID] = u.Reason
	}

	all, err := dm.payoutsOf(ctx, "")
	if err != nil {
		return err
	}
	dm.sum.FinalStates = map[pc.State]int{}
	var posted int64
	postedRef := map[string]bool{}
	for _, p := range all {
		dm.sum.FinalStates[p.State]++
		switch {
		case p.State == pc.Posted:
			posted += p.Amount
			postedRef[p.ClientRef] = true
		case p.State.Terminal():
		case p.State == pc.RailAmbiguous && unresolved[p.ID] != "":
		default:
			dm.fail("payout %s ended %s (neither terminal nor left ambiguous with a reason)", p.ID, p.State)
		}
	}
	for _, e := range dm.allFenced(ctx) {
		dm.sum.FencedOut[e.guard]++
	}

	cctx, cancel := callCtx(ctx)
	defer cancel()
	report, err := dm.rail.SettlementReport(cctx)
	if err != nil {
		return fmt.Errorf("read the rail's settlement report: %w", err)
	}
	settled := map[string]int{}
	var settledPosted int64
	for _, p := range report {
		if p.Status != railclient.StatusSettled {
			continue
		}
		settled[p.ClientRef]++
		if postedRef[p.ClientRef] {
			settledPosted += p.Amount
		}
	}
	var dupRefs []string
	for ref, n := range settled {
		if n > 1 {
			dm.sum.RailDuplicates++
			dupRefs = append(dupRefs, fmt.Sprintf("%s x%d", ref, n))
		}
	}
	sort.Strings(dupRefs)

	// What left by the ledger's own entries, not by the payouts' states.
	ledgerPaid, err := dm.paidOut(ctx)
	if err != nil {
		return err
	}
	accounts, err := dm.accounts(ctx)
	if err != nil {
		return err
	}
	for _, a := range accounts {
		dm.sum.BalanceSum += a.Balance
	}
	balanced := dm.sum.BalanceSum == 0 && len(dm.sum.LedgerFindings) == 0

	s := dm.sum
	dm.d.Printf("  payouts by final state:          %s", formatCounts(s.FinalStates))
	dm.d.Printf("  fenced-out events per guard:     payment %d, proxy %d%s", s.FencedOut["payment"], s.FencedOut["proxy"], freezeNote(s))
	dm.d.Printf("  ambiguous resolved:              %d of %d (settled %d, absent %d)", s.AmbiguousResolved, s.AmbiguousSeen, s.Resolutions["SETTLED"], s.Resolutions["ABSENT"])
	dm.d.Printf("  duplicate payments at the rail: %d", s.RailDuplicates)
	dm.d.Printf("  money settled at the rail for POSTED payouts: %d; POSTED: %d; paid out in the ledger: %d", settledPosted, posted, ledgerPaid)
	dm.d.Printf("  ledger balanced: %s (sum of %d account balances = %d; reconciler INV-03 findings: %d)", yesNo(balanced), len(accounts), s.BalanceSum, len(s.LedgerFindings))
	dm.d.Printf("  reconciler exit code: %d%s", code, findingsNote(s.ReconcileFindings))

	if s.RailDuplicates > 0 {
		dm.fail("%d client references were paid more than once at the rail: %s", s.RailDuplicates, strings.Join(dupRefs, ", "))
	}
	if s.BalanceSum != 0 {
		dm.fail("the account balances sum to %d, not 0", s.BalanceSum)
	}
	for _, f := range s.LedgerFindings {
		dm.fail("the reconciler found a ledger problem (INV-03): %s", f)
	}
	if settledPosted != posted || ledgerPaid != posted {
		dm.fail("money settled at the rail for POSTED payouts (%d), the POSTED payouts' amounts (%d) and the money the ledger paid out (%d) differ",
			settledPosted, posted, ledgerPaid)
	}
	if s.FencedOut["payment"]+s.FencedOut["proxy"] == 0 {
		dm.fail("no fence fired: the stale holder was never shown refused")
	}
	switch {
	case code == 2:
		dm.fail("the final reconciliation could not run (exit 2); see %s", dm.st.Ready.Dir+"/logs/reconcile-99.log")
	case code != 0 && code != 1:
		dm.fail("the final reconciliation exited %d", code)
	}
	for check, n := range s.ReconcileFindings {
		if !evidenceCheck[check] {
			dm.fail("the reconciler reported %d %s finding(s)", n, check)
		}
	}
	return nil
}

// evidenceCheck are the reconciler's findings that record a safety net
// firing (expected in this story) rather than an invariant broken.
var evidenceCheck = map[string]bool{
	pc.KindFencedOut:                 true,
	proxyclient.KindDuplicateAttempt: true,
	pc.KindRejectedTransition:        true,
}

func freezeNote(s Summary) string {
	switch {
	case s.FreezeMode == FreezeByHook:
		return " (holders frozen at the executor's hold hook)"
	case s.Replayed:
		return " (holder frozen by timing; its stale writes presented by the demo)"
	default:
		return " (holder frozen by timing)"
	}
}

func findingsNote(f map[string]int) string {
	if len(f) == 0 {
		return " (clean)"
	}
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	expected := true
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, f[k])
		expected = expected && evidenceCheck[k]
	}
	note := " (findings: " + strings.Join(parts, ", ")
	if expected {
		note += " — evidence that the guards fired, expected in this story"
	}
	return note + ")"
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
