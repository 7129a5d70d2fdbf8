// Package paymentclient is the payment resource's wire contract and its
// typed HTTP client. Other roles import this package, never payment itself.
//
// Every mutating method takes the fencing token and holder of the caller's
// grant as required parameters (DESIGN D-8): there is no way to change a
// payout without presenting one.
package paymentclient

import (
	"time"

	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
)

// State is a payout's state (domain model 2.3).
type State string

// The payout states.
const (
	Pending       State = "PENDING"
	Claimed       State = "CLAIMED"
	RailSubmitted State = "RAIL_SUBMITTED"
	RailAcked     State = "RAIL_ACKED"
	RailAmbiguous State = "RAIL_AMBIGUOUS"
	Posted        State = "POSTED"
	Failed        State = "FAILED"
	Abandoned     State = "ABANDONED"
)

// States lists every state, in lifecycle order.
var States = []State{Pending, Claimed, RailSubmitted, RailAcked, RailAmbiguous, Posted, Failed, Abandoned}

// Valid reports whether s is one of the eight states.
func (s State) Valid() bool {
	for _, v := range States {
		if s == v {
			return true
		}
	}
	return false
}

// Terminal reports whether s accepts no further transition.
func (s State) Terminal() bool { return s == Posted || s == Failed || s == Abandoned }

// Actionable reports whether a worker has something to do for a payout in s
// (the states GET /work looks for).
func (s State) Actionable() bool {
	return s == Pending || s == Claimed || s == RailSubmitted || s == RailAcked
}

// Outcome is what the rail proxy recorded for a submission, as reported on
// POST /payouts/{id}/outcome.
type Outcome string

// Outcomes a caller may report. Timeout covers "no recorded outcome" as
// well (domain model 2.3: a crash after forwarding is indistinguishable from
// a timeout).
const (
	OutcomeAcked    Outcome = "ACKED"
	OutcomeRejected Outcome = "REJECTED"
	OutcomeTimeout  Outcome = "TIMEOUT"
)

// Resolution is the result of an ambiguity lookup (POST /payouts/{id}/resolve).
type Resolution string

// Resolutions: the rail settled the payment, or it definitively has none.
const (
	ResolutionSettled Resolution = "SETTLED"
	ResolutionAbsent  Resolution = "ABSENT"
)

// FailureInsufficientFunds is the failure_reason of a payout whose claim
// found the account's available funds short (DESIGN D-7).
const FailureInsufficientFunds = "insufficient_funds"

// FailureRailRefused is the failure_reason of a payout the rail proxy
// refused without forwarding it (POST /payouts/{id}/refuse).
const FailureRailRefused = "rail_refused"

// ClientRefPrefix is the fixed prefix of every client reference (D-10):
// client_ref = ClientRefPrefix + payout id.
const ClientRefPrefix = wire.ClientRefPrefix

// ClientRef is the client reference the rail sees for a payout.
func ClientRef(payoutID string) string { return wire.ClientRef(payoutID) }

// System account ids, created by the service at start.
const (
	FundingAccount  = "funding"
	ClearingAccount = "payout-clearing"
)

// Account is an account as served by GET /accounts/{id}.
type Account struct {
	ID          string         `json:"id"`
	Currency    string         `json:"currency"`
	Balance     int64          `json:"balance"`
	Available   int64          `json:"available"`
	FenceToken  fencing.Token  `json:"fence_token"`
	FenceHolder fencing.Holder `json:"fence_holder"`
}

// LedgerSum is GET /accounts/{id}/ledger-sum: an account's balance beside
// the sum and count of its ledger entries, read in one statement, so the
// two are of the same moment however busy the account (INV-03: they are
// equal).
type LedgerSum struct {
	AccountID string `json:"account_id"`
	Balance   int64  `json:"balance"`
	LedgerSum int64  `json:"ledger_sum"`
	Entries   int64  `json:"entries"`
}

// CreateAccountRequest is the body of POST /accounts (fixture loading).
type CreateAccountRequest struct {
	ID             string `json:"id"`
	Currency       string `json:"currency"`
	OpeningBalance int64  `json:"opening_balance"`
}

// Payout is a payout as it stands.
type Payout struct {
	ID             string         `json:"id"`
	AccountID      string         `json:"account_id"`
	Amount         int64          `json:"amount"`
	Currency       string         `json:"currency"`
	BeneficiaryRef string         `json:"beneficiary_ref"`
	State          State          `json:"state"`
	ClientRef      string         `json:"client_ref"`
	ClaimedBy      fencing.Holder `json:"claimed_by"`
	Token          fencing.Token  `json:"token"`
	FailureReason  string         `json:"failure_reason"`
	RailRef        string         `json:"rail_ref"`
	ErrorCode      string         `json:"error_code"`
	CreatedAt      time.Time      `json:"created_at"`
	ClaimedAt      *time.Time     `json:"claimed_at"`
	SubmittedAt    *time.Time     `json:"submitted_at"`
	SettledAt      *time.Time     `json:"settled_at"`
}

// CreatePayoutRequest is the body of POST /payouts.
type CreatePayoutRequest struct {
	ID             string `json:"id"`
	AccountID      string `json:"account_id"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	BeneficiaryRef string `json:"beneficiary_ref"`
}

// FencedRequest is the body of /claim, /submitting and /post.
type FencedRequest struct {
	Token  fencing.Token  `json:"token"`
	Holder fencing.Holder `json:"holder"`
}

// OutcomeRequest is the body of /outcome.
type OutcomeRequest struct {
	Token     fencing.Token  `json:"token"`
	Holder    fencing.Holder `json:"holder"`
	Outcome   Outcome        `json:"outcome"`
	RailRef   string         `json:"rail_ref,omitempty"`
	ErrorCode string         `json:"error_code,omitempty"`
}

// ResolveRequest is the body of /resolve.
type ResolveRequest struct {
	Token      fencing.Token  `json:"token"`
	Holder     fencing.Holder `json:"holder"`
	Resolution Resolution     `json:"resolution"`
	Evidence   string         `json:"evidence"`
	// RailRef, with SETTLED, is the rail's reference of the settled
	// payment: the payout then carries it, as an ACKED outcome's does.
	// Optional; refused with ABSENT.
	RailRef string `json:"rail_ref,omitempty"`
}

// ReasonRequest is the body of /cancel and /abandon.
type ReasonRequest struct {
	Token  fencing.Token  `json:"token"`
	Holder fencing.Holder `json:"holder"`
	Reason string         `json:"reason"`
}

// RefuseRequest is the body of /refuse: ErrorCode says what the rail proxy
// refused (e.g. "invalid_request:beneficiary_ref"), Evidence carries its
// answer.
type RefuseRequest struct {
	Token     fencing.Token  `json:"token"`
	Holder    fencing.Holder `json:"holder"`
	ErrorCode string         `json:"error_code"`
	Evidence  string         `json:"evidence"`
}

// PayoutEvent is one accepted state change (the payout_event history).
type PayoutEvent struct {
	ID        int64          `json:"id"`
	PayoutID  string         `json:"payout_id"`
	FromState State          `json:"from_state"` // "" for the creation event
	ToState   State          `json:"to_state"`
	Token     fencing.Token  `json:"token"` // 0 when none (creation)
	Holder    fencing.Holder `json:"holder"`
	Actor     string         `json:"actor"`
	Reason    string         `json:"reason"`
	At        time.Time      `json:"at"`
}

// LedgerEntry is one immutable ledger row. Amount is signed: negative
// debits the account.
type LedgerEntry struct {
	ID                    int64         `json:"id"`
	GroupID               string        `json:"group_id"`
	AccountID             string        `json:"account_id"`
	Amount                int64         `json:"amount"`
	CounterpartyAccountID string        `json:"counterparty_account_id"`
	PayoutID              string        `json:"payout_id"`
	Token                 fencing.Token `json:"token"` // 0 when not posted under a grant
	CreatedAt             time.Time     `json:"created_at"`
}

// Safety event kinds the payment resource records.
const (
	KindFencedOut          = wire.KindFencedOut
	KindTokenRegression    = wire.KindTokenRegression
	KindRejectedTransition = wire.KindRejectedTransition
)

// SafetyEvent is evidence that a safety net fired (the shared wire record).
type SafetyEvent = wire.SafetyEvent

// MaxWorkSkip bounds the skip parameters of one GET /work.
const MaxWorkSkip = wire.MaxLimit

// MaxWorkWait bounds GET /work's wait_ms: how long a call that finds no
// work may wait for some (a server that is shutting down answers at once).
const MaxWorkWait = 10 * time.Second

// WorkItem is an account with actionable payouts (GET /work).
type WorkItem struct {
	AccountID  string        `json:"account_id"`
	Payouts    int           `json:"payouts"`     // actionable payouts on the account, counted up to 100 (100: 100 or more)
	OldestAt   time.Time     `json:"oldest_at"`   // creation time of the oldest of them
	FenceToken fencing.Token `json:"fence_token"` // the account's fence; informational only
	// Actionable, asked for with WorkQuery.Payouts, is the account's
	// actionable payouts in id order, read in the same snapshot as
	// FenceToken; nil when not asked for or when the account has more.
	Actionable []Payout `json:"actionable,omitempty"`
}

// MaxWorkPayouts bounds GET /work's payouts parameter.
const MaxWorkPayouts = 10

// WorkQuery is a GET /work: at most Limit accounts, leaving out those in
// Skip (at most MaxWorkSkip), waiting up to Wait (at most MaxWorkWait,
// whole milliseconds) when none has work, each account with at most
// Payouts actionable payouts (at most MaxWorkPayouts) with them.
type WorkQuery struct {
	Limit   int
	Skip    []string
	Wait    time.Duration
	Payouts int
}

// List is a page of items; Next is the cursor for the following page ("" at the end).
type List[T any] = wire.Page[T]

// HighFence is the body of GET /fences/high.
type HighFence struct {
	Token fencing.Token `json:"token"`
}

// PayoutDigest is one item of GET /payout-digests: what the reconciler
// checks about a payout, its history included, without the fields it does
// not read.
type PayoutDigest struct {
	ID          string     `json:"id"`
	AccountID   string     `json:"account_id"`
	Amount      int64      `json:"amount"`
	Currency    string     `json:"currency"`
	State       State      `json:"state"`
	ClientRef   string     `json:"client_ref"`
	CreatedAt   time.Time  `json:"created_at"`
	ClaimedAt   *time.Time `json:"claimed_at"`
	SubmittedAt *time.Time `json:"submitted_at"`
	// EventTokens are the tokens of the payout's accepted changes in event
	// order (0 for a change made under no token, such as its creation).
	EventTokens []int64 `json:"event_tokens"`
	// HistoryState is the state the payout's last recorded change moved it
	// to, read in the same statement: its state, unless that was written
	// outside the payment resource (empty from a payment resource older
	// than this member).
	HistoryState State `json:"history_state,omitempty"`
	// HistoryJumps says that one of the payout's recorded changes starts
	// from a state the change before it did not end in: its state was
	// written outside the payment resource in between.
	HistoryJumps bool `json:"history_jumps,omitempty"`
	// Ledger sums the payout's ledger entries, read in the same statement
	// (nil from a payment resource older than this member).
	Ledger *LedgerDigest `json:"ledger,omitempty"`
}

// LedgerDigest sums the ledger entries that name one payout. Its posting,
// once POSTED, is one group of two entries: -amount on the payout's
// account, +amount on payout-clearing; before that, and in any other
// state, there are none.
type LedgerDigest struct {
	Entries  int   `json:"entries"`
	Groups   int   `json:"groups"`
	Account  int64 `json:"account"`  // the sum of its entries on the payout's account
	Clearing int64 `json:"clearing"` // the sum of its entries on payout-clearing
}

// Posted reports whether l is exactly the posting of amount.
func (l LedgerDigest) Posted(amount int64) bool {
	return l.Entries == 2 && l.Groups == 1 && l.Account == -amount && l.Clearing == amount
}

// Payout is the digest as a payout (the fields a digest leaves out are
// zero).
func (d PayoutDigest) Payout() Payout {
	return Payout{ID: d.ID, AccountID: d.AccountID, Amount: d.Amount, Currency: d.Currency, State: d.State, ClientRef: d.ClientRef,
		CreatedAt: d.CreatedAt, ClaimedAt: d.ClaimedAt, SubmittedAt: d.SubmittedAt}
}
