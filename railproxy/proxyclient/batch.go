package proxyclient

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
)

// MaxBatchItems bounds the items of one POST /v1/accounts/{id}/submissions.
const MaxBatchItems = 100

// BatchItem is one payout of a batch submission (its account is the path's).
type BatchItem struct {
	PayoutID       string `json:"payout_id"`
	ClientRef      string `json:"client_ref"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	BeneficiaryRef string `json:"beneficiary_ref"`
}

// BatchSubmitRequest is the body of POST /v1/accounts/{id}/submissions:
// up to MaxBatchItems payouts of the account under one grant's token and
// holder.
type BatchSubmitRequest struct {
	Token  fencing.Token  `json:"token"`
	Holder fencing.Holder `json:"holder"`
	Items  []BatchItem    `json:"items"`
}

// BatchResult is one item's answer, in the order of the request: the
// submission's record (as POST /v1/submissions answers it), or (Err set) the
// problem that single submission would have got — on the wire the record, or
// {"payout_id", "error": <problem>}.
type BatchResult struct {
	Record   Record
	PayoutID string
	Err      *problem.Error
}

// UnmarshalJSON reads either form.
func (r *BatchResult) UnmarshalJSON(b []byte) error {
	var v struct {
		Record
		Error json.RawMessage `json:"error"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*r = BatchResult{PayoutID: v.PayoutID}
	if len(v.Error) == 0 || string(v.Error) == "null" {
		r.Record = v.Record
		return nil
	}
	if !errors.As(problem.DecodeBody(0, v.Error), &r.Err) {
		return errors.New("proxyclient: an item's error is not a problem")
	}
	r.Err.HTTPStatus = 0
	return nil
}

// BatchSubmitResponse is the answer of POST /v1/accounts/{id}/submissions.
type BatchSubmitResponse struct {
	Items []BatchResult `json:"items"`
}

// SubmitBatch submits several payouts of one account in one request: guard
// 2 judges the token once, in one transaction with every intent. Fenced
// out, the whole batch is refused (a *problem.Error fenced_out) and nothing
// is forwarded. Otherwise each item is answered as its single submission
// would be: the record with the rail's outcome, or its problem
// (submission_exists with the existing record; unavailable when the rail's
// answer could not be recorded). An error of the call itself leaves unknown
// which items were forwarded: ask (Get) before anything else.
func (c *Client) SubmitBatch(ctx context.Context, accountID string, token fencing.Token, holder fencing.Holder, items []BatchItem) ([]BatchResult, error) {
	var out BatchSubmitResponse
	err := c.c.Post(ctx, "/v1/accounts/"+httpx.PathEscape(accountID)+"/submissions",
		BatchSubmitRequest{Token: token, Holder: holder, Items: items}, &out)
	return out.Items, err
}
