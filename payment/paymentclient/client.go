package paymentclient

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
)

// Client calls the payment resource. Errors from the server are
// *problem.Error (check with problem.Has(err, problem.FencedOut) and
// friends); httpx.ErrTransport marks a call that got no answer, whose effect
// is unknown. Mutating calls are never retried.
type Client struct {
	c *httpx.Client
}

// New returns a client for the payment resource at baseURL, authenticating
// with the bearer token of the caller's role.
func New(baseURL, bearer string, opts ...httpx.ClientOption) (*Client, error) {
	c, err := httpx.NewClient(baseURL, bearer, opts...)
	if err != nil {
		return nil, fmt.Errorf("paymentclient: %w", err)
	}
	return &Client{c: c}, nil
}

// BaseURL is the server's base URL.
func (c *Client) BaseURL() string { return c.c.BaseURL() }

func payoutPath(id, action string) string {
	p := "/v1/payouts/" + httpx.PathEscape(id)
	if action != "" {
		p += "/" + action
	}
	return p
}

// CreateAccount creates an account with its opening ledger group
// (operator). Idempotent: the same body again returns the existing account;
// a different body under the same id is a conflict.
func (c *Client) CreateAccount(ctx context.Context, req CreateAccountRequest) (Account, error) {
	var out Account
	err := c.c.Post(ctx, "/v1/accounts", req, &out)
	return out, err
}

// Account returns one account with its available funds and fence.
func (c *Client) Account(ctx context.Context, id string) (Account, error) {
	var out Account
	err := c.c.Get(ctx, "/v1/accounts/"+httpx.PathEscape(id), nil, &out)
	return out, err
}

// LedgerSum returns account id's balance and the sum of its ledger
// entries, read together.
func (c *Client) LedgerSum(ctx context.Context, id string) (LedgerSum, error) {
	var out LedgerSum
	err := c.c.Get(ctx, "/v1/accounts/"+httpx.PathEscape(id)+"/ledger-sum", nil, &out)
	return out, err
}

// Accounts returns a page of accounts ordered by id, after the cursor.
func (c *Client) Accounts(ctx context.Context, after string, limit int) (List[Account], error) {
	var out List[Account]
	err := c.c.Get(ctx, "/v1/accounts", wire.PageQuery(after, limit), &out)
	return out, err
}

// CreatePayout creates a PENDING payout (operator). Idempotent on id: the
// same body again returns the payout as it stands; a different body under
// the same id is a conflict.
func (c *Client) CreatePayout(ctx context.Context, req CreatePayoutRequest) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, "/v1/payouts", req, &out)
	return out, err
}

// Payout returns one payout.
func (c *Client) Payout(ctx context.Context, id string) (Payout, error) {
	var out Payout
	err := c.c.Get(ctx, payoutPath(id, ""), nil, &out)
	return out, err
}

// PayoutFilter selects payouts for Payouts. Zero fields do not filter.
type PayoutFilter struct {
	State State
	// States selects payouts in any of these states (with State, too).
	States    []State
	AccountID string
	After     string // cursor: the Next of the previous page
	Limit     int
}

// Payouts returns a page of payouts ordered by id.
func (c *Client) Payouts(ctx context.Context, f PayoutFilter) (List[Payout], error) {
	q := wire.PageQuery(f.After, f.Limit)
	states := make([]string, 0, len(f.States)+1)
	if f.State != "" {
		states = append(states, string(f.State))
	}
	for _, s := range f.States {
		states = append(states, string(s))
	}
	if len(states) > 0 {
		q.Set("state", strings.Join(states, ","))
	}
	if f.AccountID != "" {
		q.Set("account_id", f.AccountID)
	}
	var out List[Payout]
	err := c.c.Get(ctx, "/v1/payouts", q, &out)
	return out, err
}

// PayoutDigests returns a page of up to limit payout digests (0: server
// default; at most wire.MaxBulkLimit) in id order, after payout id after
// ("" for the first page; then the previous page's Next).
func (c *Client) PayoutDigests(ctx context.Context, after string, limit int) (List[PayoutDigest], error) {
	var out List[PayoutDigest]
	err := c.c.Get(ctx, "/v1/payout-digests", wire.PageQuery(after, limit), &out)
	return out, err
}

// PayoutEvents returns a page of a payout's accepted state changes, oldest
// first, after event id after (0: from the start).
func (c *Client) PayoutEvents(ctx context.Context, payoutID string, after int64, limit int) (List[PayoutEvent], error) {
	var out List[PayoutEvent]
	err := c.c.Get(ctx, payoutPath(payoutID, "events"), wire.PageQuery(wire.IDCursor(after), limit), &out)
	return out, err
}

// TerminalExits returns a page of the accepted changes of any payout out
// of POSTED, FAILED or ABANDONED (none while INV-08 holds), in id order,
// after event id after (0: from the start).
func (c *Client) TerminalExits(ctx context.Context, after int64, limit int) (List[PayoutEvent], error) {
	var out List[PayoutEvent]
	err := c.c.Get(ctx, "/v1/terminal-exits", wire.PageQuery(wire.IDCursor(after), limit), &out)
	return out, err
}

// Work returns up to limit accounts that have actionable payouts (PENDING,
// CLAIMED, RAIL_SUBMITTED, RAIL_ACKED), the longest-waiting first.
func (c *Client) Work(ctx context.Context, limit int) ([]WorkItem, error) {
	return c.WorkSkipping(ctx, limit, nil)
}

// WorkSkipping is Work leaving out the accounts in skip (at most
// MaxWorkSkip): pass the accounts being backed off, so accounts that cannot
// progress never take the places of those that can.
func (c *Client) WorkSkipping(ctx context.Context, limit int, skip []string) ([]WorkItem, error) {
	return c.WorkFor(ctx, WorkQuery{Limit: limit, Skip: skip})
}

// WaitForWork is Work that, when no account has work, waits up to wait
// (at most MaxWorkWait, whole milliseconds) for a payout to be created and
// answers then: an empty list means none came. The call's own timeout must
// exceed wait.
func (c *Client) WaitForWork(ctx context.Context, limit int, wait time.Duration) ([]WorkItem, error) {
	return c.WorkFor(ctx, WorkQuery{Limit: limit, Wait: wait})
}

// WorkFor asks GET /work what q says. The call's own timeout must exceed
// q.Wait.
func (c *Client) WorkFor(ctx context.Context, w WorkQuery) ([]WorkItem, error) {
	q := wire.PageQuery("", w.Limit)
	for _, a := range w.Skip {
		q.Add("skip", a)
	}
	if ms := w.Wait.Milliseconds(); ms > 0 {
		q.Set("wait_ms", strconv.FormatInt(ms, 10))
	}
	if w.Payouts > 0 {
		q.Set("payouts", strconv.Itoa(w.Payouts))
	}
	var out List[WorkItem]
	err := c.c.Get(ctx, "/v1/work", q, &out)
	return out.Items, err
}

// Claim claims a payout: PENDING -> CLAIMED when the account's available
// funds cover it (else PENDING -> FAILED with failure_reason
// insufficient_funds), or CLAIMED -> CLAIMED to take over after a crash.
func (c *Client) Claim(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "claim"), FencedRequest{Token: token, Holder: holder}, &out)
	return out, err
}

// Submitting records the intent to submit (CLAIMED -> RAIL_SUBMITTED); call
// it before calling the rail proxy (DESIGN D-4).
func (c *Client) Submitting(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "submitting"), FencedRequest{Token: token, Holder: holder}, &out)
	return out, err
}

// ReportOutcome records the proxy's outcome for a RAIL_SUBMITTED payout:
// ACKED -> RAIL_ACKED, REJECTED -> FAILED, TIMEOUT -> RAIL_AMBIGUOUS.
func (c *Client) ReportOutcome(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder, outcome Outcome, railRef, errorCode string) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "outcome"), OutcomeRequest{
		Token: token, Holder: holder, Outcome: outcome, RailRef: railRef, ErrorCode: errorCode,
	}, &out)
	return out, err
}

// Post writes the payout's two ledger entries and moves RAIL_ACKED -> POSTED.
func (c *Client) Post(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "post"), FencedRequest{Token: token, Holder: holder}, &out)
	return out, err
}

// Resolve settles an ambiguous payout from external evidence (reconciler):
// SETTLED -> RAIL_ACKED, ABSENT -> FAILED. evidence must not be empty.
func (c *Client) Resolve(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder, resolution Resolution, evidence, railRef string) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "resolve"), ResolveRequest{
		Token: token, Holder: holder, Resolution: resolution, Evidence: evidence, RailRef: railRef,
	}, &out)
	return out, err
}

// Cancel abandons a PENDING payout (operator); reason must not be empty.
func (c *Client) Cancel(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder, reason string) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "cancel"), ReasonRequest{Token: token, Holder: holder, Reason: reason}, &out)
	return out, err
}

// Refuse ends a RAIL_SUBMITTED payout whose submission the rail proxy
// refused without forwarding it (a 400 with "forwarded": false, and no
// forwarded submission at the proxy): RAIL_SUBMITTED -> FAILED with
// failure_reason rail_refused and errorCode, its held amount released.
// errorCode and evidence must not be empty. Never for fenced_out,
// submission_exists or a call that got no answer.
func (c *Client) Refuse(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder, errorCode, evidence string) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "refuse"), RefuseRequest{Token: token, Holder: holder, ErrorCode: errorCode, Evidence: evidence}, &out)
	return out, err
}

// Abandon hands a RAIL_AMBIGUOUS payout to finance (operator); reason must
// not be empty.
func (c *Client) Abandon(ctx context.Context, payoutID string, token fencing.Token, holder fencing.Holder, reason string) (Payout, error) {
	var out Payout
	err := c.c.Post(ctx, payoutPath(payoutID, "abandon"), ReasonRequest{Token: token, Holder: holder, Reason: reason}, &out)
	return out, err
}

// Ledger returns a page of ledger entries in id order, after entry id after.
func (c *Client) Ledger(ctx context.Context, after int64, limit int) (List[LedgerEntry], error) {
	var out List[LedgerEntry]
	err := c.c.Get(ctx, "/v1/ledger", wire.PageQuery(wire.IDCursor(after), limit), &out)
	return out, err
}

// SafetyEvents returns a page of safety events in id order, after event id after.
func (c *Client) SafetyEvents(ctx context.Context, after int64, limit int) (List[SafetyEvent], error) {
	var out List[SafetyEvent]
	err := c.c.Get(ctx, "/v1/safety-events", wire.PageQuery(wire.IDCursor(after), limit), &out)
	return out, err
}

// WhoAmI is the identity the client's token has at the payment resource.
func (c *Client) WhoAmI(ctx context.Context) (auth.Identity, error) { return c.c.WhoAmI(ctx) }

// HighFence returns the highest fence any account stores (compare with the
// lock service's highest issued token: above it means a token regression).
func (c *Client) HighFence(ctx context.Context) (fencing.Token, error) {
	var out HighFence
	err := c.c.Get(ctx, "/v1/fences/high", nil, &out)
	return out.Token, err
}
