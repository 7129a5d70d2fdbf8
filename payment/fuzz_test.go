package payment

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/payouts/payouts/dev/fuzzhttp"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	pc "github.com/payouts/payouts/payment/paymentclient"
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

// paydbState is what a refused request must leave as it was: every row
// count but the safety events (a rejection writes its evidence, D-1), and
// every account's balance, version and fence and every payout's state.
type paydbState struct {
	accounts, payouts, events, entries int64
	digest                             string
}

// FuzzPaymentRequests sends malformed and valid bodies, under malformed and
// valid path ids, to every payment resource endpoint that decodes one: the
// creates, each fenced step, and the batched steps. Every answer is a 2xx or
// a 4xx problem (DESIGN §5); a 4xx changes nothing in paydb but its
// safety-event evidence.
func FuzzPaymentRequests(f *testing.F) {
	e := setup(f)
	e.account(f, "fz-acc", 10_000)
	e.payout(f, "fz-1", "fz-acc", 100)
	e.payout(f, "fz-2", "fz-acc", 100)
	e.drive(f, "fz-2", pc.Claimed, 5, "h-5")
	snapshot := func(t testing.TB) paydbState {
		var s paydbState
		if err := e.svc.pool.QueryRow(tctx(t), `SELECT (SELECT count(*) FROM account), (SELECT count(*) FROM payout),
			(SELECT count(*) FROM payout_event), (SELECT count(*) FROM ledger_entry),
			(SELECT string_agg(id || ':' || balance || ':' || version || ':' || fence_token || ':' || coalesce(fence_holder, ''), ',' ORDER BY id) FROM account) || '|' ||
			(SELECT coalesce(string_agg(id || ':' || state, ',' ORDER BY id), '') FROM payout)`).
			Scan(&s.accounts, &s.payouts, &s.events, &s.entries, &s.digest); err != nil {
			t.Fatalf("read paydb: %v", err)
		}
		return s
	}
	bearer := map[auth.Role]string{auth.Executor: executorBearer, auth.Reconciler: reconcilerBearer, auth.Operator: operatorBearer}
	type route struct{ path, token string } // path: %s is the (escaped) path argument
	routes := []route{{"/v1/accounts", operatorBearer}, {"/v1/payouts", operatorBearer}, {"/v1/accounts/%s/steps", executorBearer}}
	for _, op := range Ops {
		routes = append(routes, route{"/v1/payouts/%s/" + string(op), bearer[opRoles[op][0]]})
	}
	seeds := []struct {
		route     int
		arg, body string
	}{
		{0, "", `{"id":"fz-new","currency":"EUR","opening_balance":100}`},
		{0, "", `{"id":"fz-acc","currency":"EUR","opening_balance":5}`},
		{0, "", `{"id":"funding","currency":"EUR","opening_balance":1}`},
		{0, "", `{"id":"fz-x","currency":"EUR","opening_balance":9223372036854775807}`},
		{1, "", `{"id":"fz-3","account_id":"fz-acc","amount":100,"currency":"EUR","beneficiary_ref":"b"}`},
		{1, "", `{"id":"fz-1","account_id":"fz-acc","amount":999,"currency":"EUR","beneficiary_ref":"b"}`},
		{1, "", `{"id":"fz-4","account_id":"no-such","amount":1,"currency":"EUR","beneficiary_ref":"b"}`},
		{1, "", `{"id":"fz-5","account_id":"fz-acc","amount":1,"currency":"EUR","beneficiary_ref":"\u202eb"}`},
		{2, "fz-acc", `{"token":5,"holder":"h-5","op":"claim","items":[{"payout_id":"fz-1"}]}`},
		{2, "fz-acc", `{"token":4,"holder":"h-4","op":"claim","items":[{"payout_id":"fz-1"}]}`},
		{2, "fz-acc", `{"token":6,"holder":"h-6","op":"claim","items":[]}`},
		{2, "fz-acc", `{"token":6,"holder":"h-6","op":"cancel","items":[{"payout_id":"fz-1"}]}`},
		{2, "fz-acc", `{"token":6,"holder":"h-6","op":"claim","items":[{"payout_id":"fz-1"},{"payout_id":"fz-1"}]}`},
		{2, "no-such", `{"token":6,"holder":"h-6","op":"claim","items":[{"payout_id":"fz-1"}]}`},
		{3, "fz-1", `{"token":6,"holder":"h-6"}`},
		{3, "fz-1", `{"token":4,"holder":"h-4"}`},
		{3, "fz-1", `{"token":5,"holder":"other"}`},
		{3, "fz-2", `{"token":5,"holder":"h-5"}`},
		{3, "no-such", `{"token":6,"holder":"h-6"}`},
		{3, "", `{"token":6,"holder":"h-6"}`},
		{3, strings.Repeat("p", 200), `{"token":6,"holder":"h-6"}`},
		{4, "fz-2", `{"token":5,"holder":"h-5"}`},
		{5, "fz-2", `{"token":5,"holder":"h-5","outcome":"ACKED","rail_ref":"r"}`},
		{5, "fz-2", `{"token":5,"holder":"h-5","outcome":"MAYBE"}`},
		{6, "fz-2", `{"token":5,"holder":"h-5"}`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.route), s.arg, []byte(s.body))
	}
	for _, body := range []string{``, `null`, `[]`, `{`, `"x"`, `{"a":1}`, `{"token":"5","holder":"h-5"}`, "\xff\xfe",
		`{"token":5,"holder":"h-5","reason":"r","evidence":"e","error_code":"x"}`, `{"token":7,"holder":"h\u0000"}`} {
		for i := range routes {
			f.Add(uint8(i), "fz-1", []byte(body))
		}
	}
	f.Fuzz(func(t *testing.T, idx uint8, arg string, body []byte) {
		r := routes[int(idx)%len(routes)]
		path := strings.Replace(r.path, "%s", url.PathEscape(arg), 1)
		before := snapshot(t)
		a := fuzzhttp.Do(t, http.MethodPost, e.url+path, r.token, body)
		if a.OK() {
			return
		}
		if after := snapshot(t); after != before {
			t.Fatalf("POST %s with body %q was refused (%d %s) but changed paydb:\n%+v\n->\n%+v", path, body, a.Status, a.Code, before, after)
		}
	})
}
