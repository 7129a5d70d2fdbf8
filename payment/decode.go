package payment

import (
	"net/http"
	"regexp"
	"strings"
	"unicode"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// MaxAmount bounds every amount: 0 < amount < 10^15 minor units (D-14).
const MaxAmount int64 = 1_000_000_000_000_000

// Field limits.
const (
	maxIDLen     = 128
	maxRefLen    = 256
	maxHolderLen = 256
	maxTextLen   = 4096
)

// idRE is what account and payout ids look like: they travel in URL paths
// and in the lock key payout:{account_id}.
var idRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// badField is an invalid_request naming the field it is about.
func badField(field, format string, args ...any) *problem.Error {
	e := problem.New(problem.InvalidRequest, field+": "+format, args...)
	return e.With("field", field)
}

func validID(field, v string) error {
	if v == "" {
		return badField(field, "required")
	}
	if !idRE.MatchString(v) {
		return badField(field, "must be 1-%d characters of A-Z a-z 0-9 . _ - starting with a letter or digit", maxIDLen)
	}
	return nil
}

// validText checks a free-text field: no control characters in one-line
// fields, never a NUL (PostgreSQL text cannot hold one), bounded length.
func validText(field, v string, maxLen int, required, oneLine bool) error {
	if strings.TrimSpace(v) == "" {
		if required {
			return badField(field, "required and must not be blank")
		}
		if v != "" {
			return badField(field, "must not be blank")
		}
		return nil
	}
	if len(v) > maxLen {
		return badField(field, "longer than %d bytes", maxLen)
	}
	for _, r := range v {
		if r == 0 || r == unicode.ReplacementChar || (oneLine && unicode.IsControl(r)) {
			return badField(field, "contains a control or invalid character")
		}
	}
	return nil
}

func validFence(token fencing.Token, holder fencing.Holder) error {
	if token == 0 {
		return badField("token", "required: the fencing token of the caller's grant (a positive integer)")
	}
	if err := token.Check(); err != nil {
		return badField("token", "%v", err)
	}
	if holder == "" {
		return badField("holder", "required: the session id of the caller's grant")
	}
	return validText("holder", string(holder), maxHolderLen, true, true)
}

func validAmount(field string, v int64, allowZero bool) error {
	if v < 0 || (v == 0 && !allowZero) {
		return badField(field, "must be a positive integer number of minor units, got %d", v)
	}
	if v >= MaxAmount {
		return badField(field, "must be below 10^15 minor units, got %d", v)
	}
	return nil
}

func validCurrency(v, want string) error {
	if v == "" {
		return badField("currency", "required")
	}
	if v != want {
		return badField("currency", "this service handles %s only, got %q", want, v)
	}
	return nil
}

func reservedAccount(id string) bool { return id == pc.FundingAccount || id == pc.ClearingAccount }

func decodeCreateAccount(r *http.Request, currency string) (pc.CreateAccountRequest, error) {
	var req pc.CreateAccountRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return req, err
	}
	if err := validID("id", req.ID); err != nil {
		return req, err
	}
	if reservedAccount(req.ID) {
		return req, badField("id", "%q is a system account", req.ID)
	}
	if err := validCurrency(req.Currency, currency); err != nil {
		return req, err
	}
	return req, validAmount("opening_balance", req.OpeningBalance, true)
}

func decodeCreatePayout(r *http.Request, currency string) (pc.CreatePayoutRequest, error) {
	var req pc.CreatePayoutRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return req, err
	}
	if err := validID("id", req.ID); err != nil {
		return req, err
	}
	if err := validID("account_id", req.AccountID); err != nil {
		return req, err
	}
	if reservedAccount(req.AccountID) {
		return req, badField("account_id", "%q is a system account; payouts are made from customer accounts", req.AccountID)
	}
	if err := validAmount("amount", req.Amount, false); err != nil {
		return req, err
	}
	if err := validCurrency(req.Currency, currency); err != nil {
		return req, err
	}
	return req, validText("beneficiary_ref", req.BeneficiaryRef, maxRefLen, true, true)
}

// decodeCommand decodes the body of a fenced mutation into a Command.
func decodeCommand(r *http.Request, op Op) (Command, error) {
	cmd := Command{Op: op}
	switch op {
	case OpClaim, OpSubmitting, OpPost:
		var req pc.FencedRequest
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return cmd, err
		}
		cmd.Token, cmd.Holder = req.Token, req.Holder
	case OpOutcome:
		var req pc.OutcomeRequest
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return cmd, err
		}
		cmd.Token, cmd.Holder, cmd.Outcome, cmd.RailRef, cmd.ErrorCode = req.Token, req.Holder, req.Outcome, req.RailRef, req.ErrorCode
	case OpResolve:
		var req pc.ResolveRequest
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return cmd, err
		}
		cmd.Token, cmd.Holder, cmd.Resolution, cmd.Text = req.Token, req.Holder, req.Resolution, req.Evidence
	case OpCancel, OpAbandon:
		var req pc.ReasonRequest
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return cmd, err
		}
		cmd.Token, cmd.Holder, cmd.Text = req.Token, req.Holder, req.Reason
	default:
		return cmd, problem.New(problem.NotFound, "no operation %q", op)
	}
	if err := validFence(cmd.Token, cmd.Holder); err != nil {
		return cmd, err
	}
	switch op {
	case OpOutcome:
		switch cmd.Outcome {
		case pc.OutcomeAcked, pc.OutcomeRejected, pc.OutcomeTimeout:
		case "":
			return cmd, badField("outcome", "required: ACKED, REJECTED or TIMEOUT")
		default:
			return cmd, badField("outcome", "must be ACKED, REJECTED or TIMEOUT, got %q", cmd.Outcome)
		}
		if err := validText("rail_ref", cmd.RailRef, maxRefLen, false, true); err != nil {
			return cmd, err
		}
		if err := validText("error_code", cmd.ErrorCode, maxRefLen, false, true); err != nil {
			return cmd, err
		}
	case OpResolve:
		switch cmd.Resolution {
		case pc.ResolutionSettled, pc.ResolutionAbsent:
		case "":
			return cmd, badField("resolution", "required: SETTLED or ABSENT")
		default:
			return cmd, badField("resolution", "must be SETTLED or ABSENT, got %q", cmd.Resolution)
		}
		if err := validText("evidence", cmd.Text, maxTextLen, true, false); err != nil {
			return cmd, err
		}
	case OpCancel, OpAbandon:
		if err := validText("reason", cmd.Text, maxTextLen, true, false); err != nil {
			return cmd, err
		}
	}
	return cmd, nil
}
