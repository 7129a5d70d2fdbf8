package paymentclient

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// MaxStepItems bounds the items of one POST /accounts/{id}/steps.
const MaxStepItems = 100

// StepOp is a step that POST /accounts/{id}/steps applies to many payouts
// of one account at once.
type StepOp string

// The batchable steps: the executor's four.
const (
	StepClaim      StepOp = "claim"
	StepSubmitting StepOp = "submitting"
	StepOutcome    StepOp = "outcome"
	StepPost       StepOp = "post"
)

// StepItem is one payout of a batch; Outcome, RailRef and ErrorCode are
// for StepOutcome only (as in OutcomeRequest).
type StepItem struct {
	PayoutID  string  `json:"payout_id"`
	Outcome   Outcome `json:"outcome,omitempty"`
	RailRef   string  `json:"rail_ref,omitempty"`
	ErrorCode string  `json:"error_code,omitempty"`
}

// StepsRequest is the body of POST /accounts/{id}/steps: one step for up to
// MaxStepItems payouts of the account, under one grant's token and holder.
// Then, when set, is a second step applied in the same transaction to every
// item the first one brought to the state it starts from: StepSubmitting
// after StepClaim, or StepPost after StepOutcome (a compound step).
//
// WhileCovered (claim only) makes the claims stop, once an item of the
// request has been claimed, at the first PENDING item the account's
// available funds do not cover: that item and every PENDING one after it
// are answered as they stand, unchanged, to be claimed once the claimed ones
// have settled — as if claimed one at a time. An item in another state is
// judged as without it. Without it such an item fails
// with insufficient_funds, though a claimed one declined at the rail would
// have given its money back.
type StepsRequest struct {
	Token        fencing.Token  `json:"token"`
	Holder       fencing.Holder `json:"holder"`
	Op           StepOp         `json:"op"`
	Then         StepOp         `json:"then,omitempty"`
	WhileCovered bool           `json:"while_covered,omitempty"`
	Items        []StepItem     `json:"items"`
}

// StepResult is one item's answer, in the order of the request: the payout
// as it now stands, or (Err set) why this item was not applied — the
// payout as sent on the wire, or {"payout_id", "error": <problem>}.
type StepResult struct {
	Payout   Payout
	PayoutID string
	Err      *problem.Error
}

// MarshalJSON renders the payout, or {"payout_id", "error"}.
func (r StepResult) MarshalJSON() ([]byte, error) {
	if r.Err != nil {
		return json.Marshal(struct {
			PayoutID string         `json:"payout_id"`
			Error    *problem.Error `json:"error"`
		}{r.PayoutID, r.Err})
	}
	return json.Marshal(r.Payout)
}

// UnmarshalJSON reads either form.
func (r *StepResult) UnmarshalJSON(b []byte) error {
	var w stepWire
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	return w.into(r)
}

// stepWire is either form of an item on the wire, read in one pass: the
// payout's fields, or payout_id and error.
type stepWire struct {
	Payout
	PayoutID string          `json:"payout_id"`
	Error    json.RawMessage `json:"error"`
}

func (w *stepWire) into(r *StepResult) error {
	if len(w.Error) > 0 && string(w.Error) != "null" {
		var pe *problem.Error
		if !errors.As(problem.DecodeBody(0, w.Error), &pe) {
			return errors.New("paymentclient: an item's error is not a problem")
		}
		pe.HTTPStatus = 0
		*r = StepResult{PayoutID: w.PayoutID, Err: pe}
		return nil
	}
	*r = StepResult{Payout: w.Payout, PayoutID: w.Payout.ID}
	return nil
}

// StepsResponse is the answer of POST /accounts/{id}/steps.
type StepsResponse struct {
	Items []StepResult `json:"items"`
}

// Steps applies one step to several payouts of one account in one
// transaction under one grant (DESIGN D-3: the fence is the account's).
// Guard 1 judges the token once, first: fenced out, the whole request is
// refused (a *problem.Error fenced_out) and nothing changes. Otherwise each
// item is decided by the transition table on its own: the answer holds, in
// the request's order, the payout as it now stands or the item's problem
// (invalid_transition, not_found).
func (c *Client) Steps(ctx context.Context, accountID string, token fencing.Token, holder fencing.Holder, op StepOp, items []StepItem) ([]StepResult, error) {
	return c.StepsThen(ctx, accountID, token, holder, op, "", items)
}

// StepsThen is Steps with a compound step: op, then (when not empty) the
// step then for every item op brought to the state then starts from
// (StepClaim then StepSubmitting: CLAIMED; StepOutcome then StepPost:
// RAIL_ACKED), all in one transaction, guard 1 once, first. Each item's
// answer is the payout in its final state: an item op left elsewhere
// (FAILED, RAIL_AMBIGUOUS) ends there, and an item op refused has its
// problem, as for Steps.
func (c *Client) StepsThen(ctx context.Context, accountID string, token fencing.Token, holder fencing.Holder, op, then StepOp, items []StepItem) ([]StepResult, error) {
	return c.PostSteps(ctx, accountID, StepsRequest{Token: token, Holder: holder, Op: op, Then: then, Items: items})
}

// PostSteps sends req as it is (StepsThen, with every member of the
// request at hand, WhileCovered included).
func (c *Client) PostSteps(ctx context.Context, accountID string, req StepsRequest) ([]StepResult, error) {
	// The answer is decoded straight into the wire form: through
	// StepResult's UnmarshalJSON each item would be scanned twice more.
	var out struct {
		Items []stepWire `json:"items"`
	}
	if err := c.c.Post(ctx, "/v1/accounts/"+httpx.PathEscape(accountID)+"/steps", req, &out); err != nil {
		return nil, err
	}
	return stepResults(out.Items)
}

// stepResults turns the answer's items into results.
func stepResults(items []stepWire) ([]StepResult, error) {
	res := make([]StepResult, len(items))
	for i := range items {
		if err := items[i].into(&res[i]); err != nil {
			return nil, err
		}
	}
	return res, nil
}
