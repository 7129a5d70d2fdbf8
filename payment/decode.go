package payment

import (
	"net/http"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// MaxAmount bounds every amount: 0 < amount < 10^15 minor units (D-14).
const MaxAmount = wire.MaxAmount

// badField is an invalid_request naming the field it is about.
func badField(field, format string, args ...any) *problem.Error {
	return wire.BadField(field, format, args...)
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
	if err := wire.ValidID("id", req.ID); err != nil {
		return req, err
	}
	if reservedAccount(req.ID) {
		return req, badField("id", "%q is a system account", req.ID)
	}
	if err := validCurrency(req.Currency, currency); err != nil {
		return req, err
	}
	return req, wire.ValidAmount("opening_balance", req.OpeningBalance, true)
}

func decodeCreatePayout(r *http.Request, currency string) (pc.CreatePayoutRequest, error) {
	var req pc.CreatePayoutRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return req, err
	}
	if err := wire.ValidID("id", req.ID); err != nil {
		return req, err
	}
	if err := wire.ValidID("account_id", req.AccountID); err != nil {
		return req, err
	}
	if reservedAccount(req.AccountID) {
		return req, badField("account_id", "%q is a system account; payouts are made from customer accounts", req.AccountID)
	}
	if err := wire.ValidAmount("amount", req.Amount, false); err != nil {
		return req, err
	}
	if err := validCurrency(req.Currency, currency); err != nil {
		return req, err
	}
	return req, wire.ValidRef("beneficiary_ref", req.BeneficiaryRef)
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
		cmd.Token, cmd.Holder, cmd.Resolution, cmd.Text, cmd.RailRef = req.Token, req.Holder, req.Resolution, req.Evidence, req.RailRef
	case OpCancel, OpAbandon:
		var req pc.ReasonRequest
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return cmd, err
		}
		cmd.Token, cmd.Holder, cmd.Text = req.Token, req.Holder, req.Reason
	case OpRefuse:
		var req pc.RefuseRequest
		if err := httpx.DecodeJSON(r, &req); err != nil {
			return cmd, err
		}
		cmd.Token, cmd.Holder, cmd.ErrorCode, cmd.Text = req.Token, req.Holder, req.ErrorCode, req.Evidence
	default:
		return cmd, problem.New(problem.NotFound, "no operation %q", op)
	}
	if err := wire.ValidFence(cmd.Token, cmd.Holder); err != nil {
		return cmd, err
	}
	switch op {
	case OpOutcome:
		if err := validOutcome("", cmd.Outcome, cmd.RailRef, cmd.ErrorCode); err != nil {
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
		if err := wire.ValidText("evidence", cmd.Text, wire.MaxTextLen, true, false); err != nil {
			return cmd, err
		}
		if cmd.RailRef != "" {
			if cmd.Resolution == pc.ResolutionAbsent {
				return cmd, badField("rail_ref", "names a payment at the rail: only with SETTLED")
			}
			if err := wire.ValidRef("rail_ref", cmd.RailRef); err != nil {
				return cmd, err
			}
		}
	case OpCancel, OpAbandon:
		if err := wire.ValidText("reason", cmd.Text, wire.MaxTextLen, true, false); err != nil {
			return cmd, err
		}
	case OpRefuse:
		if err := wire.ValidRef("error_code", cmd.ErrorCode); err != nil {
			return cmd, err
		}
		if err := wire.ValidText("evidence", cmd.Text, wire.MaxTextLen, true, false); err != nil {
			return cmd, err
		}
	}
	return cmd, nil
}

// validOutcome checks the members of an outcome report; prefix names where
// they are in the body ("" at the top level, "items[3]." in a batch).
func validOutcome(prefix string, outcome pc.Outcome, railRef, errorCode string) error {
	switch outcome {
	case pc.OutcomeAcked, pc.OutcomeRejected, pc.OutcomeTimeout:
	case "":
		return badField(prefix+"outcome", "required: ACKED, REJECTED or TIMEOUT")
	default:
		return badField(prefix+"outcome", "must be ACKED, REJECTED or TIMEOUT, got %q", outcome)
	}
	if err := wire.ValidText(prefix+"rail_ref", railRef, wire.MaxRefLen, outcome == pc.OutcomeAcked, true); err != nil {
		return err // an ACKED payment is the rail's: its reference is the evidence reconciliation matches
	}
	return wire.ValidText(prefix+"error_code", errorCode, wire.MaxRefLen, false, true)
}
