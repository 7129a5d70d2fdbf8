// Package proxyclient is the client of the rail proxy (`payouts serve
// proxy`), the second fencing guard in front of the rail, and its wire types.
//
// Submit is the only mutating call and takes the fencing token and holder as
// required typed parameters. It is never retried: after an error that is not
// a problem (ErrTransport) the submission may or may not have been forwarded;
// ask Get before doing anything else (DESIGN D-4).
package proxyclient

import (
	"context"
	"encoding/json"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
)

// Outcome is what became of a forwarded submission. The zero value means no
// outcome is recorded (JSON null): forwarded, or about to be, and the ending
// unknown — as ambiguous as TIMEOUT.
type Outcome string

// Outcomes (DESIGN D-5, domain model 2.2).
const (
	OutcomeNone     Outcome = ""
	OutcomeAcked    Outcome = "ACKED"    // the rail took the payment: money has left
	OutcomeRejected Outcome = "REJECTED" // the rail declined it: nothing moved
	OutcomeTimeout  Outcome = "TIMEOUT"  // no usable answer: money may have moved
	OutcomeFenced   Outcome = "FENCED"   // stale token: never forwarded (evidence only)
)

// ErrorCodeNotForwardedInTime is the error code of a submission recorded
// REJECTED without being sent: its rail call could not start within the
// proxy's send window. The rail never saw it; it says nothing of the rail.
const ErrorCodeNotForwardedInTime = "not_forwarded_in_time"

// Ambiguous reports whether money may have moved without us knowing.
func (o Outcome) Ambiguous() bool { return o == OutcomeNone || o == OutcomeTimeout }

// MarshalJSON renders the zero value as null.
func (o Outcome) MarshalJSON() ([]byte, error) { return nullable(string(o)) }

// UnmarshalJSON reads null as the zero value.
func (o *Outcome) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*o = ""
	if s != nil {
		*o = Outcome(*s)
	}
	return nil
}

// Resolution is the ambiguity resolution of a submission from rail evidence,
// recorded once (DESIGN D-6). The zero value (JSON null) means unresolved.
type Resolution string

// Resolutions.
const (
	ResolutionNone    Resolution = ""
	ResolutionSettled Resolution = "SETTLED" // the rail holds a settled payment for the client reference
	ResolutionAbsent  Resolution = "ABSENT"  // after the settlement window the rail holds no settled payment
)

// MarshalJSON renders the zero value as null.
func (r Resolution) MarshalJSON() ([]byte, error) { return nullable(string(r)) }

// UnmarshalJSON reads null as the zero value.
func (r *Resolution) UnmarshalJSON(b []byte) error {
	var s *string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*r = ""
	if s != nil {
		*r = Resolution(*s)
	}
	return nil
}

func nullable(s string) ([]byte, error) {
	if s == "" {
		return []byte("null"), nil
	}
	return json.Marshal(s)
}

// Submission is what a caller asks the proxy to forward to the rail.
type Submission struct {
	PayoutID       string
	AccountID      string
	ClientRef      string // stable for the payout's whole life (DESIGN D-10)
	Amount         int64  // minor units, > 0
	Currency       string
	BeneficiaryRef string
	// Resubmission marks the submission of a payout an earlier holder
	// left RAIL_SUBMITTED and the proxy holds no forwarded submission of
	// (DESIGN D-4): the proxy asks the rail about its client reference
	// first. A payment the rail holds is recorded as the outcome, not sent
	// again; without a final answer the proxy answers 503 with
	// "forwarded": false (PausedUnforwarded) and records nothing.
	Resubmission bool
}

// SubmitRequest is the wire body of POST /v1/submissions.
type SubmitRequest struct {
	PayoutID       string         `json:"payout_id"`
	AccountID      string         `json:"account_id"`
	Token          fencing.Token  `json:"token"`
	Holder         fencing.Holder `json:"holder"`
	ClientRef      string         `json:"client_ref"`
	Amount         int64          `json:"amount"`
	Currency       string         `json:"currency"`
	BeneficiaryRef string         `json:"beneficiary_ref"`
	Resubmission   bool           `json:"resubmission,omitempty"`
}

// Record is one submission attempt as the proxy stores it.
type Record struct {
	ID                 int64           `json:"id"`
	PayoutID           string          `json:"payout_id"`
	AccountID          string          `json:"account_id"`
	FenceToken         fencing.Token   `json:"fence_token"`
	Holder             fencing.Holder  `json:"holder"`
	ClientRef          string          `json:"client_ref"`
	Amount             int64           `json:"amount"`
	Currency           string          `json:"currency"`
	BeneficiaryRef     string          `json:"beneficiary_ref"`
	Outcome            Outcome         `json:"outcome"`
	RailRef            string          `json:"rail_ref"`
	ErrorCode          string          `json:"error_code"`
	Resolution         Resolution      `json:"resolution"`
	ResolutionEvidence json.RawMessage `json:"resolution_evidence,omitempty"`
	CreatedAt          time.Time       `json:"created_at"`
	OutcomeAt          *time.Time      `json:"outcome_at"`
	ResolutionAt       *time.Time      `json:"resolution_at"`
}

// IsOf reports whether the record is the submission of the payout with
// this id, amount and currency, and client reference when one is given:
// a record that is not is never trusted either way.
func (r Record) IsOf(payoutID string, amount int64, currency, clientRef string) bool {
	return r.PayoutID == payoutID && r.Amount == amount && r.Currency == currency &&
		(clientRef == "" || r.ClientRef == clientRef)
}

// Forwarded reports whether the record is the payout's one forwarded
// submission (anything but a FENCED attempt).
func (r Record) Forwarded() bool { return r.Outcome != OutcomeFenced }

// SubmissionDigest is one item of GET /v1/submission-digests: what the
// reconciler checks about a submission attempt.
type SubmissionDigest struct {
	ID         int64          `json:"id"`
	PayoutID   string         `json:"payout_id"`
	AccountID  string         `json:"account_id"`
	FenceToken fencing.Token  `json:"fence_token"`
	Holder     fencing.Holder `json:"holder"`
	Outcome    Outcome        `json:"outcome"`
	Resolution Resolution     `json:"resolution"`
	// CreatedAt is when the attempt was written (zero from a proxy older
	// than this member).
	CreatedAt time.Time `json:"created_at"`
}

// Record is the digest as a record (the fields a digest leaves out are
// zero).
func (d SubmissionDigest) Record() Record {
	return Record{ID: d.ID, PayoutID: d.PayoutID, AccountID: d.AccountID, FenceToken: d.FenceToken, Holder: d.Holder,
		Outcome: d.Outcome, Resolution: d.Resolution, CreatedAt: d.CreatedAt}
}

// SubmissionDigestCursor is the cursor of GET /v1/submission-digests
// after the given attempt: its payout id and its id.
func SubmissionDigestCursor(d SubmissionDigest) string {
	return d.PayoutID + ":" + strconv.FormatInt(d.ID, 10)
}

// ParseSubmissionDigestCursor reads a SubmissionDigestCursor ("": from
// the start).
func ParseSubmissionDigestCursor(v string) (payoutID string, id int64, err error) {
	if v == "" {
		return "", 0, nil
	}
	i := strings.LastIndexByte(v, ':')
	if i < 0 {
		return "", 0, wire.BadField("after", "is not a cursor this service issued: %q", v)
	}
	n, perr := strconv.ParseInt(v[i+1:], 10, 64)
	if perr != nil || n < 0 || !wire.IDPattern.MatchString(v[:i]) {
		return "", 0, wire.BadField("after", "is not a cursor this service issued: %q", v)
	}
	return v[:i], n, nil
}

// SubmissionDigestPage is a page of GET /v1/submission-digests.
type SubmissionDigestPage = wire.Page[SubmissionDigest]

// SubmissionOrder is one item of GET /v1/submission-order: a forwarded
// submission, in id order, which is per account the order the
// submissions committed in, and the token it was forwarded under.
type SubmissionOrder struct {
	ID         int64         `json:"id"`
	PayoutID   string        `json:"payout_id"`
	AccountID  string        `json:"account_id"`
	FenceToken fencing.Token `json:"fence_token"`
}

// SubmissionOrderPage is a page of GET /v1/submission-order.
type SubmissionOrderPage = wire.Page[SubmissionOrder]

// RecordPage is a page of GET /v1/submissions.
type RecordPage = wire.Page[Record]

// RailPayment is a payment the rail reports for a client reference.
type RailPayment struct {
	RailRef        string `json:"rail_ref"`
	ClientRef      string `json:"client_ref"`
	Amount         int64  `json:"amount"`
	Currency       string `json:"currency"`
	BeneficiaryRef string `json:"beneficiary_ref"`
	Status         string `json:"status"`
	DeclineCode    string `json:"decline_code,omitempty"`
	At             string `json:"at"`
}

// LookupResult is the answer of POST /v1/submissions/{payout_id}/lookup.
type LookupResult struct {
	// Final is true when the rail's answer is final (its settlement window
	// has passed); only then is a resolution recorded.
	Final bool `json:"final"`
	// Recorded is true when this lookup wrote the resolution.
	Recorded bool `json:"recorded"`
	// Resolution is what the rail's answer means (also for a submission
	// whose outcome is not ambiguous, where nothing is recorded); the zero
	// value when not final.
	Resolution Resolution `json:"resolution"`
	// Detail says in words why nothing was recorded, when nothing was.
	Detail string `json:"detail,omitempty"`
	// RailItems are the rail's payments for the client reference.
	RailItems []RailPayment `json:"rail_items"`
	// Submission is the record as it now stands.
	Submission Record `json:"submission"`
}

// SafetyEvent is evidence that a safety net fired at the proxy (the shared
// wire record; kinds fenced_out, token_regression, duplicate_attempt).
type SafetyEvent = wire.SafetyEvent

// Safety event kinds.
const (
	KindFencedOut        = wire.KindFencedOut
	KindTokenRegression  = wire.KindTokenRegression
	KindDuplicateAttempt = wire.KindDuplicateAttempt
)

// SafetyEventPage is a page of GET /v1/safety-events.
type SafetyEventPage = wire.Page[SafetyEvent]

// HighWater is the proxy's fence for one account.
type HighWater struct {
	AccountID string         `json:"account_id"`
	Token     fencing.Token  `json:"token"`
	Holder    fencing.Holder `json:"holder"`
	UpdatedAt time.Time      `json:"updated_at"`
}

// HighWaterPage is a page of GET /v1/high-water.
type HighWaterPage = wire.Page[HighWater]

// HighToken is the body of GET /v1/fences/high.
type HighToken struct {
	Token fencing.Token `json:"token"`
}

// ExistingExtension is the problem member carrying the existing record on a
// submission_exists error.
const ExistingExtension = "submission"

// ForwardedExtension is the problem member that says whether a refused
// submission reached the rail: false on an invalid_request refused before
// anything was written or forwarded, and on an unavailable answered while
// the rail is paused.
const ForwardedExtension = "forwarded"

// RefusedUnforwarded reports whether err is the proxy refusing a submission
// it will never accept as sent (invalid_request) before writing or
// forwarding anything ("forwarded": false). Such a payout can be ended
// (paymentclient.Refuse); any other error — fenced_out, submission_exists,
// no answer — must not be read this way.
func RefusedUnforwarded(err error) bool {
	return unforwarded(err, problem.InvalidRequest)
}

// PausedUnforwarded reports whether err is the proxy answering, while the
// rail gives no usable answer, that it neither recorded nor forwarded the
// submission (unavailable, "forwarded": false). Nothing reached the rail:
// the payout stays RAIL_SUBMITTED and is submitted again later. A plain
// unavailable (no "forwarded" member) says nothing of the kind.
func PausedUnforwarded(err error) bool {
	return unforwarded(err, problem.Unavailable)
}

// ShuttingDownExtension is the problem member (true) of a submission the
// proxy refused, unrecorded and unforwarded, because it is shutting down:
// it says nothing of the rail.
const ShuttingDownExtension = "shutting_down"

// ShuttingDown reports whether err is a proxy refusing a submission, with
// nothing recorded or forwarded, because it is shutting down (a
// PausedUnforwarded answer that says nothing of the rail).
func ShuttingDown(err error) bool {
	var pe *problem.Error
	var down bool
	return PausedUnforwarded(err) && errors.As(err, &pe) && pe.Extension(ShuttingDownExtension, &down) && down
}

func unforwarded(err error, code problem.Code) bool {
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Code != code {
		return false
	}
	var forwarded bool
	return pe.Extension(ForwardedExtension, &forwarded) && !forwarded
}

// Client talks to the rail proxy.
type Client struct {
	c *httpx.Client
}

// DefaultTimeout bounds each call; Submit waits for the rail's answer.
const DefaultTimeout = 60 * time.Second

// New returns a client of the proxy at baseURL authenticating with token.
// The default per-call timeout is DefaultTimeout (override with
// httpx.WithTimeout).
func New(baseURL, token string, opts ...httpx.ClientOption) (*Client, error) {
	c, err := httpx.NewClient(baseURL, token, append([]httpx.ClientOption{httpx.WithTimeout(DefaultTimeout)}, opts...)...)
	if err != nil {
		return nil, err
	}
	return &Client{c: c}, nil
}

// Submit asks the proxy to forward sub to the rail under the grant
// (token, holder), and returns the record with its outcome. Errors:
//   - fenced_out (*problem.Error with Key, PresentedToken, StoredToken): the
//     token is stale at the proxy; nothing was forwarded.
//   - submission_exists: the payout already has a forwarded submission;
//     ExistingRecord(err) returns it. Resolve from it; never resubmit.
//   - invalid_request: bad input; nothing was written.
//   - an httpx.ErrTransport error: no answer; the submission may have been
//     forwarded. Ask Get.
func (c *Client) Submit(ctx context.Context, sub Submission, token fencing.Token, holder fencing.Holder) (Record, error) {
	req := SubmitRequest{
		PayoutID: sub.PayoutID, AccountID: sub.AccountID, Token: token, Holder: holder,
		ClientRef: sub.ClientRef, Amount: sub.Amount, Currency: sub.Currency, BeneficiaryRef: sub.BeneficiaryRef,
		Resubmission: sub.Resubmission,
	}
	var r Record
	err := c.c.Post(ctx, "/v1/submissions", req, &r)
	return r, err
}

// WhoAmI is the identity the client's token has at the proxy.
func (c *Client) WhoAmI(ctx context.Context) (auth.Identity, error) { return c.c.WhoAmI(ctx) }

// ExistingRecord returns the existing forwarded record carried by a
// submission_exists error.
func ExistingRecord(err error) (Record, bool) {
	var pe *problem.Error
	if !errors.As(err, &pe) || pe.Code != problem.SubmissionExists {
		return Record{}, false
	}
	var r Record
	if !pe.Extension(ExistingExtension, &r) {
		return Record{}, false
	}
	return r, true
}

// Get returns the payout's forwarded submission if there is one, else its
// newest FENCED attempt; a not_found problem when there is neither (the
// payout was never forwarded).
func (c *Client) Get(ctx context.Context, payoutID string) (Record, error) {
	var r Record
	err := c.c.Get(ctx, "/v1/submissions/"+url.PathEscape(payoutID), nil, &r)
	return r, err
}

// GetAll returns every attempt for the payout, oldest first (empty when none).
func (c *Client) GetAll(ctx context.Context, payoutID string) ([]Record, error) {
	var p RecordPage
	err := c.c.Get(ctx, "/v1/submissions/"+url.PathEscape(payoutID), url.Values{"all": {"true"}}, &p)
	return p.Items, err
}

// List pages through every submission attempt in id order; pass the
// previous page's Next as after ("" for the first page; limit 0: server
// default).
func (c *Client) List(ctx context.Context, after string, limit int) (RecordPage, error) {
	var p RecordPage
	err := c.c.Get(ctx, "/v1/submissions", wire.PageQuery(after, limit), &p)
	return p, err
}

// SubmissionOrder pages through the forwarded submissions in id order,
// after id after (0: from the start; limit 0: server default, at most
// wire.MaxBulkLimit).
func (c *Client) SubmissionOrder(ctx context.Context, after int64, limit int) (SubmissionOrderPage, error) {
	var p SubmissionOrderPage
	err := c.c.Get(ctx, "/v1/submission-order", wire.PageQuery(wire.IDCursor(after), limit), &p)
	return p, err
}

// SubmissionDigests pages through every submission attempt ordered by
// payout id, then id; pass the previous page's Next as after ("" for the
// first page; limit 0: server default, at most wire.MaxBulkLimit).
func (c *Client) SubmissionDigests(ctx context.Context, after string, limit int) (SubmissionDigestPage, error) {
	var p SubmissionDigestPage
	err := c.c.Get(ctx, "/v1/submission-digests", wire.PageQuery(after, limit), &p)
	return p, err
}

// Lookup asks the rail, by the payout's client reference, what happened to
// its forwarded submission, and records the resolution (SETTLED / ABSENT)
// once when the answer is final and the outcome was ambiguous. Not a
// mutation of the payout: it needs no token. not_found when the payout has
// no forwarded submission; unavailable when the rail could not be asked.
func (c *Client) Lookup(ctx context.Context, payoutID string) (LookupResult, error) {
	var r LookupResult
	err := c.c.Post(ctx, "/v1/submissions/"+url.PathEscape(payoutID)+"/lookup", struct{}{}, &r)
	return r, err
}

// SafetyEvents pages through the proxy's safety events in id order.
func (c *Client) SafetyEvents(ctx context.Context, after string, limit int) (SafetyEventPage, error) {
	var p SafetyEventPage
	err := c.c.Get(ctx, "/v1/safety-events", wire.PageQuery(after, limit), &p)
	return p, err
}

// HighFence returns the highest token the proxy has accepted for any
// account (0 when none).
func (c *Client) HighFence(ctx context.Context) (fencing.Token, error) {
	var h HighToken
	err := c.c.Get(ctx, "/v1/fences/high", nil, &h)
	return h.Token, err
}

// HighWater pages through the per-account high-water marks in account order.
func (c *Client) HighWater(ctx context.Context, after string, limit int) (HighWaterPage, error) {
	var p HighWaterPage
	err := c.c.Get(ctx, "/v1/high-water", wire.PageQuery(after, limit), &p)
	return p, err
}
