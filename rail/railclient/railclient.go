// Package railclient is the client of the rail stub (`payouts serve rail`),
// the stand-in for the external payment network, and its wire types.
//
// The rail is not idempotent: every accepted Pay is a new payment, so a
// caller that retries a Pay after an unclear answer may move money twice.
// Pay is therefore never retried by this client, and an error from Pay means
// "the effect is unknown" unless it is a problem answered before acceptance.
package railclient

import (
	"context"
	"net/url"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/wire"
)

// Payment statuses.
const (
	StatusSettled  = "settled"  // the money moved
	StatusDeclined = "declined" // a business rejection: nothing moved
)

// DefaultDeclinePrefix is the beneficiary prefix the rail declines unless
// configured otherwise.
const DefaultDeclinePrefix = "DECLINE"

// DeclineCodeBeneficiary is the decline code for a declined beneficiary.
const DeclineCodeBeneficiary = "beneficiary_declined"

// PaymentRequest is the body of POST /v1/payments.
type PaymentRequest struct {
	ClientRef      string `json:"client_ref"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	BeneficiaryRef string `json:"beneficiary_ref"`
}

// Payment is one payment the rail accepted (settled or declined).
type Payment struct {
	RailRef        string `json:"rail_ref"`
	ClientRef      string `json:"client_ref"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	BeneficiaryRef string `json:"beneficiary_ref"`
	Status         string `json:"status"`
	DeclineCode    string `json:"decline_code,omitempty"`
	At             string `json:"at"` // RFC 3339 with nanoseconds, UTC
}

// Lookup is the answer of a search by client reference. Final is true only
// once the rail's settlement window has passed since the newest attempt
// carrying that reference: before that, an empty Items proves nothing.
type Lookup struct {
	Items []Payment `json:"items"`
	Final bool      `json:"final"`
}

// Faults are the rail's injected failure rates (each 0..1, drawn
// independently per payment request) and its added latency and decline rule.
type Faults struct {
	// TimeoutAfterAccept: the payment is made, then no answer is sent until
	// the caller gives up.
	TimeoutAfterAccept float64 `json:"timeout_after_accept"`
	// DropBeforeAccept: the connection is closed with no answer and no payment.
	DropBeforeAccept float64 `json:"drop_before_accept"`
	// ErrorAfterAccept: the payment is made, then a 5xx is answered.
	ErrorAfterAccept float64 `json:"error_after_accept"`
	// ErrorBeforeAccept: a 5xx is answered and no payment is made.
	ErrorBeforeAccept float64 `json:"error_before_accept"`
	// LatencyMS is added before every payment request is processed.
	LatencyMS int64 `json:"latency_ms"`
	// DeclineBeneficiaryPrefix: beneficiaries starting with it are declined.
	DeclineBeneficiaryPrefix string `json:"decline_beneficiary_prefix"`
}

// DefaultFaults are the settings `payouts serve rail` starts with: no
// injected failure, beneficiaries starting with DefaultDeclinePrefix
// declined.
func DefaultFaults() Faults { return Faults{DeclineBeneficiaryPrefix: DefaultDeclinePrefix} }

// FaultsUpdate is the body of PUT /v1/faults: absent members keep their
// current value.
type FaultsUpdate struct {
	TimeoutAfterAccept       *float64 `json:"timeout_after_accept,omitempty"`
	DropBeforeAccept         *float64 `json:"drop_before_accept,omitempty"`
	ErrorAfterAccept         *float64 `json:"error_after_accept,omitempty"`
	ErrorBeforeAccept        *float64 `json:"error_before_accept,omitempty"`
	LatencyMS                *int64   `json:"latency_ms,omitempty"`
	DeclineBeneficiaryPrefix *string  `json:"decline_beneficiary_prefix,omitempty"`
}

// Full returns an update that sets every member to f's value.
func (f Faults) Full() FaultsUpdate {
	return FaultsUpdate{
		TimeoutAfterAccept:       &f.TimeoutAfterAccept,
		DropBeforeAccept:         &f.DropBeforeAccept,
		ErrorAfterAccept:         &f.ErrorAfterAccept,
		ErrorBeforeAccept:        &f.ErrorBeforeAccept,
		LatencyMS:                &f.LatencyMS,
		DeclineBeneficiaryPrefix: &f.DeclineBeneficiaryPrefix,
	}
}

// Report is the settlement report: every payment the rail ever accepted.
// A page of it (GET /settlement-report?after=&limit=) holds the payments
// of whole client references in client-reference order, and Next, the
// cursor of the following page ("" on the last one).
type Report struct {
	Items []Payment `json:"items"`
	Next  string    `json:"next,omitempty"`
}

// Client talks to the rail.
type Client struct {
	c *httpx.Client
}

// New returns a client of the rail at baseURL, authenticating with token.
func New(baseURL, token string, opts ...httpx.ClientOption) (*Client, error) {
	c, err := httpx.NewClient(baseURL, token, opts...)
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// Pay asks the rail to make a payment. Never retried. A nil error with
// Status declined is a business rejection. Any error may mean the payment
// was made (the rail accepts, then fails or never answers): callers must
// treat it as ambiguous, never as "not paid".
func (c *Client) Pay(ctx context.Context, req PaymentRequest) (Payment, error) {
	var p Payment
	err := c.c.Post(ctx, "/v1/payments", req, &p)
	return p, err
}

// Find lists the payments carrying clientRef and whether that answer is
// final (the settlement window has passed).
func (c *Client) Find(ctx context.Context, clientRef string) (Lookup, error) {
	var l Lookup
	err := c.c.Get(ctx, "/v1/payments", url.Values{"client_ref": {clientRef}}, &l)
	return l, err
}

// SettlementReport lists every payment ever accepted (operator only).
func (c *Client) SettlementReport(ctx context.Context) ([]Payment, error) {
	var r Report
	err := c.c.Get(ctx, "/v1/settlement-report", nil, &r)
	return r.Items, err
}

// SettlementReportPage returns the payments of the client references
// after after ("" for the first page; then the previous page's Next), in
// client-reference order and, within one reference, in the order the rail
// accepted them: about limit payments (0: server default, at most
// wire.MaxBulkLimit), never splitting one reference's payments across
// pages (operator only).
func (c *Client) SettlementReportPage(ctx context.Context, after string, limit int) (Report, error) {
	q := wire.PageQuery(after, limit)
	if len(q) == 0 {
		q.Set("after", "")
	}
	var r Report
	err := c.c.Get(ctx, "/v1/settlement-report", q, &r)
	return r, err
}

// SetFaults changes the fault settings (operator only) and returns them as
// they now stand.
func (c *Client) SetFaults(ctx context.Context, u FaultsUpdate) (Faults, error) {
	var f Faults
	err := c.c.Put(ctx, "/v1/faults", u, &f)
	return f, err
}

// Faults returns the current fault settings (operator only).
func (c *Client) Faults(ctx context.Context) (Faults, error) {
	var f Faults
	err := c.c.Get(ctx, "/v1/faults", nil, &f)
	return f, err
}

// BaseURL is the rail's base URL.
func (c *Client) BaseURL() string { return c.c.BaseURL() }

// WhoAmI is the identity the client's token has at the rail.
func (c *Client) WhoAmI(ctx context.Context) (auth.Identity, error) { return c.c.WhoAmI(ctx) }
