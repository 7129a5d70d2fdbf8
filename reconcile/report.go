package reconcile

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/payouts/payouts/lock/fencing"
)

// Invariants, as the domain model (2.5) numbers them.
const (
	INV01 = "INV-01" // at most one worker mutates a payout
	INV02 = "INV-02" // at most one rail submission ever succeeds
	INV03 = "INV-03" // the ledger balances (and matches the money that moved)
	INV04 = "INV-04" // tokens never repeat or go backwards
	INV05 = "INV-05" // no write below the stored fence
	INV07 = "INV-07" // no side effect without a grant
	INV08 = "INV-08" // terminal states are terminal
)

// Check names: the "check" member of a finding and the label of the
// findings metric. docs/operations.md has a section for each.
const (
	CheckInFlightPerAccount      = "in_flight_per_account"           // INV-01
	CheckClaimTokenOrder         = "claim_token_order"               // INV-01
	CheckForwardedSubmissions    = "forwarded_submissions"           // INV-02
	CheckSettledPerClientRef     = "settled_per_client_ref"          // INV-02
	CheckRailWithoutSubmission   = "rail_payment_without_submission" // INV-02
	CheckDuplicateAttempt        = "duplicate_attempt"               // INV-02
	CheckAmbiguousOverSLA        = "ambiguous_over_sla"              // INV-02
	CheckAmbiguousNoSubmission   = "ambiguous_without_submission"    // INV-02
	CheckAmbiguousConflict       = "ambiguous_evidence_conflict"     // INV-02
	CheckLedgerGroupSum          = "ledger_group_sum"                // INV-03
	CheckBalanceDrift            = "balance_drift"                   // INV-03
	CheckPostedNotSettled        = "posted_not_settled"              // INV-03
	CheckSettledNotPosted        = "settled_not_posted"              // INV-03
	CheckSubmissionStateMismatch = "submission_state_mismatch"       // INV-03
	CheckAmountMismatch          = "rail_amount_mismatch"            // INV-03
	CheckPayoutPosting           = "payout_posting"                  // INV-03
	CheckLockRewound             = "lock_service_rewound"            // INV-04
	CheckTokenRegression         = "token_regression"                // INV-04
	CheckHighWaterAboveFence     = "high_water_above_fence"          // INV-04
	CheckFencedOut               = "fenced_out"                      // INV-05
	CheckLedgerTokenOrder        = "ledger_token_order"              // INV-05
	CheckSubmissionTokenOrder    = "submission_token_order"          // INV-05
	CheckSubmissionWithoutGrant  = "submission_without_grant"        // INV-07
	CheckLedgerWithoutGrant      = "ledger_without_grant"            // INV-07
	CheckRejectedTransition      = "rejected_transition"             // INV-08
	CheckTerminalLeft            = "terminal_state_left"             // INV-08
	CheckStateNotInHistory       = "state_not_in_history"            // INV-08
)

// checkInvariant maps every check to its invariant (also the metric's
// label set, so each check is exported as 0 when clean).
var checkInvariant = map[string]string{
	CheckInFlightPerAccount:      INV01,
	CheckClaimTokenOrder:         INV01,
	CheckForwardedSubmissions:    INV02,
	CheckSettledPerClientRef:     INV02,
	CheckRailWithoutSubmission:   INV02,
	CheckDuplicateAttempt:        INV02,
	CheckAmbiguousOverSLA:        INV02,
	CheckAmbiguousNoSubmission:   INV02,
	CheckAmbiguousConflict:       INV02,
	CheckLedgerGroupSum:          INV03,
	CheckBalanceDrift:            INV03,
	CheckPostedNotSettled:        INV03,
	CheckSettledNotPosted:        INV03,
	CheckSubmissionStateMismatch: INV03,
	CheckAmountMismatch:          INV03,
	CheckPayoutPosting:           INV03,
	CheckLockRewound:             INV04,
	CheckTokenRegression:         INV04,
	CheckHighWaterAboveFence:     INV04,
	CheckFencedOut:               INV05,
	CheckLedgerTokenOrder:        INV05,
	CheckSubmissionTokenOrder:    INV05,
	CheckSubmissionWithoutGrant:  INV07,
	CheckLedgerWithoutGrant:      INV07,
	CheckRejectedTransition:      INV08,
	CheckTerminalLeft:            INV08,
	CheckStateNotInHistory:       INV08,
}

// Checks lists every check name, sorted.
func Checks() []string {
	out := make([]string, 0, len(checkInvariant))
	for c := range checkInvariant {
		out = append(out, c)
	}
	sort.Strings(out)
	return out
}

// InvariantOf returns the invariant a check asserts.
func InvariantOf(check string) string { return checkInvariant[check] }

// Complete reports whether every check of the pass ran to its end.
func (r *Report) Complete() bool { return r != nil && r.checked }

// Finding is one violation, or one piece of evidence that a safety net
// fired: which invariant, which check, the objects involved and what was
// seen.
type Finding struct {
	Invariant string         `json:"invariant"`
	Check     string         `json:"check"`
	Objects   map[string]any `json:"objects"`
	Evidence  string         `json:"evidence"`
}

// Resolved is one ambiguous payout this pass resolved from rail evidence.
type Resolved struct {
	PayoutID   string        `json:"payout_id"`
	AccountID  string        `json:"account_id"`
	ClientRef  string        `json:"client_ref"`
	Resolution string        `json:"resolution"` // SETTLED or ABSENT
	State      string        `json:"state"`      // the payout's state afterwards
	Token      fencing.Token `json:"token"`      // the grant the resolution was made under
	Evidence   string        `json:"evidence"`
}

// Pending is an ambiguous payout left as it is this pass, and why.
type Pending struct {
	PayoutID  string `json:"payout_id"`
	AccountID string `json:"account_id"`
	Reason    string `json:"reason"`
}

// Report is the result of one reconciliation pass.
type Report struct {
	Findings []Finding  `json:"findings"`
	Resolved []Resolved `json:"resolved"`
	// Unresolved are the ambiguous payouts the pass looked at but left.
	Unresolved []Pending `json:"unresolved"`
	// HighestFence is the highest fence either guard stores: a restored
	// PostgreSQL lock service must be bumped above it (DESIGN D-13).
	HighestFence fencing.Token `json:"highest_fence"`
	PayDBFence   fencing.Token `json:"paydb_high_fence"`
	ProxyFence   fencing.Token `json:"proxy_high_fence"`
	// LockHighToken is the lock service's high token: at or above every
	// token it has issued, below every one it will issue (GET /v1/tokens/high).
	LockHighToken fencing.Token `json:"lock_high_token"`
	// Counts are the findings per check, including any not listed
	// because of the listing cap.
	Counts map[string]int `json:"counts"`
	// Truncated is how many findings were counted but not listed.
	Truncated int `json:"truncated"`
	// Scanned says how much was read.
	Scanned Scanned `json:"scanned"`
	// Notes are limits of this pass an operator should know about
	// (e.g. a check that could not run in full).
	Notes []string `json:"notes"`
	// SafetyEventsSeen is the highest safety-event id read at each guard;
	// with --state-file the next pass reports only events after it.
	SafetyEventsSeen EventCursor `json:"safety_events_seen"`

	maxFindings int
	// checked: every check ran to its end (also in a pass whose
	// resolution of ambiguous payouts could not finish).
	checked bool
	// mu guards Findings, Counts, Truncated and Notes: payouts are checked
	// concurrently.
	mu sync.Mutex
}

// Scanned counts what one pass read.
type Scanned struct {
	Payouts       int `json:"payouts"`
	Accounts      int `json:"accounts"`
	LedgerEntries int `json:"ledger_entries"`
	Grants        int `json:"grants"`
	RailPayments  int `json:"rail_payments"`
	SafetyEvents  int `json:"safety_events"`
	HighWater     int `json:"high_water"`
}

func newReport(maxFindings int) *Report {
	return &Report{
		Findings: []Finding{}, Resolved: []Resolved{}, Unresolved: []Pending{},
		Counts: map[string]int{}, Notes: []string{}, maxFindings: maxFindings,
	}
}

// add records a finding (listing it unless the cap is reached; counting it
// always).
func (r *Report) add(check string, objects map[string]any, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Counts[check]++
	if r.maxFindings > 0 && len(r.Findings) >= r.maxFindings {
		r.Truncated++
		return
	}
	r.Findings = append(r.Findings, Finding{
		Invariant: checkInvariant[check], Check: check, Objects: objects, Evidence: fmt.Sprintf(format, args...),
	})
}

func (r *Report) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Clean reports whether the pass found nothing.
func (r *Report) Clean() bool {
	for _, n := range r.Counts {
		if n > 0 {
			return false
		}
	}
	return true
}

// sort orders findings by invariant, check, then evidence, so output is
// stable from pass to pass.
func (r *Report) sort() {
	sort.SliceStable(r.Findings, func(i, j int) bool {
		a, b := r.Findings[i], r.Findings[j]
		if a.Invariant != b.Invariant {
			return a.Invariant < b.Invariant
		}
		if a.Check != b.Check {
			return a.Check < b.Check
		}
		return a.Evidence < b.Evidence
	})
}

// WriteJSON writes the report as one JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteTable writes the report for a human.
func (r *Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	if len(r.Findings) == 0 {
		fmt.Fprintln(tw, "No findings.")
	} else {
		fmt.Fprintln(tw, "INVARIANT\tCHECK\tOBJECTS\tEVIDENCE")
		for _, f := range r.Findings {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Invariant, f.Check, objectsString(f.Objects), f.Evidence)
		}
		if r.Truncated > 0 {
			fmt.Fprintf(tw, "... and %d more findings not listed (see counts)\n", r.Truncated)
		}
	}
	if len(r.Resolved) > 0 {
		fmt.Fprintln(tw, "\nRESOLVED PAYOUT\tACCOUNT\tRESOLUTION\tSTATE\tTOKEN")
		for _, x := range r.Resolved {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\n", x.PayoutID, x.AccountID, x.Resolution, x.State, x.Token)
		}
	}
	if len(r.Unresolved) > 0 {
		fmt.Fprintln(tw, "\nAMBIGUOUS, LEFT\tACCOUNT\tREASON")
		for _, x := range r.Unresolved {
			fmt.Fprintf(tw, "%s\t%s\t%s\n", x.PayoutID, x.AccountID, x.Reason)
		}
	}
	fmt.Fprintf(tw, "\nhighest fence stored by either guard: %d (paydb %d, proxy %d)\n", r.HighestFence, r.PayDBFence, r.ProxyFence)
	fmt.Fprintf(tw, "lock service's high token (every token issued is at or below it): %d\n", r.LockHighToken)
	fmt.Fprintf(tw, "scanned: %d payouts, %d accounts, %d ledger entries, %d grants, %d rail payments, %d safety events\n",
		r.Scanned.Payouts, r.Scanned.Accounts, r.Scanned.LedgerEntries, r.Scanned.Grants, r.Scanned.RailPayments, r.Scanned.SafetyEvents)
	for _, n := range r.Notes {
		fmt.Fprintf(tw, "note: %s\n", n)
	}
	return tw.Flush()
}

func objectsString(o map[string]any) string {
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%v", k, o[k]))
	}
	return strings.Join(parts, " ")
}
