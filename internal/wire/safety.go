package wire

import (
	"time"

	"github.com/payouts/payouts/lock/fencing"
)

// SafetyEvent is evidence that a safety net fired at a guard (DESIGN §4):
// a fenced_out, token_regression, rejected_transition or duplicate_attempt,
// as both guards serve it on GET /v1/safety-events.
type SafetyEvent struct {
	ID             int64          `json:"id"`
	Kind           string         `json:"kind"`
	Key            string         `json:"key"`
	PresentedToken fencing.Token  `json:"presented_token"`
	StoredToken    fencing.Token  `json:"stored_token"`
	Holder         fencing.Holder `json:"holder"`
	StoredHolder   fencing.Holder `json:"stored_holder"`
	PayoutID       string         `json:"payout_id"`
	Detail         string         `json:"detail"`
	At             time.Time      `json:"at"`
}

// Safety event kinds, across both guards.
const (
	KindFencedOut          = "fenced_out"
	KindTokenRegression    = "token_regression"
	KindRejectedTransition = "rejected_transition"
	KindDuplicateAttempt   = "duplicate_attempt"
)
