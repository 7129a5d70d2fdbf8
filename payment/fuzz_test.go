package payment

import (
	"bytes"
	"net/http/httptest"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
)

// checkDecodeErr: a decoder either accepts or answers a 4xx problem; it
// never panics and never produces a server error.
func checkDecodeErr(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	pe := problem.From(err)
	if pe.Status() < 400 || pe.Status() >= 500 {
		t.Fatalf("decoder answered %d (%v)", pe.Status(), err)
	}
}

func FuzzDecodeCommand(f *testing.F) {
	for _, s := range []string{
		`{"token":1,"holder":"h"}`,
		`{"token":5,"holder":"h","outcome":"ACKED","rail_ref":"r-1"}`,
		`{"token":5,"holder":"h","resolution":"SETTLED","evidence":"lookup"}`,
		`{"token":5,"holder":"h","reason":"why"}`,
		`{"token":5,"holder":"h","error_code":"invalid_request:beneficiary_ref","evidence":"proxy 400"}`,
		`{"token":-1,"holder":"h"}`, `{"token":1.5}`, `{"token":9007199254740992,"holder":"h"}`,
		`{"token":1,"holder":"\u0000"}`, `{"token":1,"holder":"h","extra":1}`, `[]`, `null`, ``,
	} {
		for i := range Ops {
			f.Add(uint8(i), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, opIdx uint8, body []byte) {
		op := Ops[int(opIdx)%len(Ops)]
		r := httptest.NewRequest("POST", "/", bytes.NewReader(body))
		cmd, err := decodeCommand(r, op)
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if !cmd.Token.Valid() || cmd.Holder == "" {
			t.Fatalf("accepted a command without a valid fence: %+v", cmd)
		}
		if (op == OpCancel || op == OpAbandon || op == OpResolve || op == OpRefuse) && cmd.Text == "" {
			t.Fatalf("accepted %s without a reason or evidence", op)
		}
		if op == OpOutcome && cmd.Outcome == "" {
			t.Fatalf("accepted an outcome without one")
		}
	})
}

func FuzzDecodeCreatePayout(f *testing.F) {
	for _, s := range []string{
		`{"id":"po-1","account_id":"acc-1","amount":100,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"id":"po-1","account_id":"acc-1","amount":0,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"id":"po-1","account_id":"funding","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"id":"po/1","account_id":"acc-1","amount":1000000000000000,"currency":"USD","beneficiary_ref":""}`,
		`{"id":"po-1","amount":"1"}`, `{}`, `{"id":"po-1"} {}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeCreatePayout(httptest.NewRequest("POST", "/", bytes.NewReader(body)), "EUR")
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if req.Amount <= 0 || req.Amount >= MaxAmount || req.Currency != "EUR" || !wire.IDPattern.MatchString(req.ID) ||
			!wire.IDPattern.MatchString(req.AccountID) || reservedAccount(req.AccountID) || req.BeneficiaryRef == "" {
			t.Fatalf("accepted an invalid payout: %+v", req)
		}
	})
}

func FuzzDecodeCreateAccount(f *testing.F) {
	for _, s := range []string{
		`{"id":"acc-1","currency":"EUR","opening_balance":100}`,
		`{"id":"acc-1","currency":"EUR","opening_balance":-1}`,
		`{"id":"payout-clearing","currency":"EUR","opening_balance":0}`,
		`{"id":"","currency":"eur"}`, `{"id":"acc-1","currency":"EUR","opening_balance":1e3}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := decodeCreateAccount(httptest.NewRequest("POST", "/", bytes.NewReader(body)), "EUR")
		checkDecodeErr(t, err)
		if err != nil {
			return
		}
		if req.OpeningBalance < 0 || req.OpeningBalance >= MaxAmount || req.Currency != "EUR" || !wire.IDPattern.MatchString(req.ID) || reservedAccount(req.ID) {
			t.Fatalf("accepted an invalid account: %+v", req)
		}
	})
}
