package payment

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// traceRoundTrips makes the service's pool count its round trips.
func traceRoundTrips(t *testing.T, e *testBundle) *pgtest.RoundTrips {
	t.Helper()
	rt := &pgtest.RoundTrips{}
	old := e.svc.pool
	e.svc.pool = rt.Pool(t, old.Config().ConnString())
	t.Cleanup(old.Close)
	return rt
}

// postPayout sends POST /v1/payouts as the operator and returns the status
// and the problem's code and field, if any.
func postPayout(t *testing.T, e *testBundle, body string) (status int, code, field string) {
	t.Helper()
	req, err := http.NewRequestWithContext(tctx(t), http.MethodPost, e.url+"/v1/payouts", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+operatorBearer)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var prob struct {
		Code  string `json:"code"`
		Field string `json:"field"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&prob)
	return resp.StatusCode, prob.Code, prob.Field
}

// Creating a payout is one statement: created, an idempotent replay, a
// conflicting body, an unknown account and a wrong currency each get
// today's answer and status, in one round trip each.
func TestCreatePayoutAnswersInOneRoundTrip(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	rt := traceRoundTrips(t, e)
	ctx := tctx(t)
	created := e.svc.m.transitions.WithLabelValues("", string(pc.Pending))
	req := pc.CreatePayoutRequest{ID: "po-1", AccountID: "acc-1", Amount: 400, Currency: "EUR", BeneficiaryRef: "ben-1"}

	rt.Reset()
	p, isNew, err := e.svc.CreatePayout(ctx, req, "operator:alice")
	if err != nil || !isNew || p.State != pc.Pending || p.ClientRef != "po-po-1" || p.Amount != 400 || p.CreatedAt.IsZero() {
		t.Fatalf("create: %+v %v %v", p, isNew, err)
	}
	if n := rt.Count(); n != 1 {
		t.Fatalf("create: %d round trips, want 1", n)
	}
	if n := e.eventCount(t, "po-1"); n != 1 {
		t.Fatalf("creation events: %d, want 1", n)
	}
	if v := counterValue(created); v != 1 {
		t.Fatalf("created transitions counted: %v, want 1", v)
	}

	rt.Reset()
	again, isNew, err := e.svc.CreatePayout(ctx, req, "operator:alice")
	if err != nil || isNew || again != p {
		t.Fatalf("replay: %+v %v %v, want %+v", again, isNew, err, p)
	}
	if n := rt.Count(); n != 1 {
		t.Fatalf("replay: %d round trips, want 1", n)
	}

	diff := req
	diff.Amount = 401
	_, _, err = e.svc.CreatePayout(ctx, diff, "operator:alice")
	pe := wantCode(t, err, problem.Conflict)
	var shown pc.Payout
	if !pe.Extension("payout", &shown) || shown.Amount != 400 {
		t.Fatalf("conflict: %+v, want the existing payout", pe)
	}

	unknown := req
	unknown.ID, unknown.AccountID = "po-2", "acc-9"
	_, _, err = e.svc.CreatePayout(ctx, unknown, "operator:alice")
	if pe := wantCode(t, err, problem.InvalidRequest); !pe.Extension("field", new(string)) || !strings.Contains(pe.Message, "account_id") {
		t.Fatalf("unknown account: %+v", pe)
	}
	// An existing id under an unknown account is a different body under
	// the id: a conflict showing the payout (contract §4), not the
	// account's error.
	unknown.ID = "po-1"
	_, _, err = e.svc.CreatePayout(ctx, unknown, "operator:alice")
	if pe := wantCode(t, err, problem.Conflict); !pe.Extension("payout", &shown) || shown.ID != "po-1" {
		t.Fatalf("existing id, unknown account: %+v, want the existing payout", pe)
	}
	var field string

	wrong := req
	wrong.ID, wrong.Currency = "po-3", "USD"
	_, _, err = e.svc.CreatePayout(ctx, wrong, "operator:alice")
	if pe := wantCode(t, err, problem.InvalidRequest); !pe.Extension("field", &field) || field != "currency" || !strings.Contains(pe.Message, "holds EUR, not USD") {
		t.Fatalf("wrong currency: %+v", pe)
	}
	if v := counterValue(created); v != 1 {
		t.Fatalf("created transitions counted: %v, want 1 (only the first call created)", v)
	}
	if c := e.counts(t); c["payout"] != 1 || c["payout_event"] != 1 {
		t.Fatalf("rows: %v, want one payout and its one event", c)
	}

	// Over HTTP: 201, 200 on replay, 409 on a different body, 400 naming the field.
	body := `{"id":"po-4","account_id":"acc-1","amount":100,"currency":"EUR","beneficiary_ref":"b"}`
	for _, tc := range []struct {
		name, body          string
		status              int
		wantCode, wantField string
	}{
		{"created", body, http.StatusCreated, "", ""},
		{"replay", body, http.StatusOK, "", ""},
		{"conflict", strings.Replace(body, `"amount":100`, `"amount":101`, 1), http.StatusConflict, string(problem.Conflict), ""},
		{"existing id, unknown account", strings.Replace(body, "acc-1", "acc-9", 1), http.StatusConflict, string(problem.Conflict), ""},
		{"unknown account", strings.Replace(strings.Replace(body, "acc-1", "acc-9", 1), "po-4", "po-5", 1), http.StatusBadRequest, string(problem.InvalidRequest), "account_id"},
	} {
		if status, code, field := postPayout(t, e, tc.body); status != tc.status || code != tc.wantCode || field != tc.wantField {
			t.Errorf("%s: %d %q %q, want %d %q %q", tc.name, status, code, field, tc.status, tc.wantCode, tc.wantField)
		}
	}
}

// A fenced transaction is two round trips: BEGIN rides in front of the
// guard batch, COMMIT behind the write batch.
func TestFencedTransactionRoundTrips(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 10_000)
	for _, id := range []string{"po-1", "po-2", "po-3"} {
		e.payout(t, id, "acc-1", 100)
	}
	rt := traceRoundTrips(t, e)
	ctx := tctx(t)
	cmd := func(op Op) Command { return Command{Op: op, Token: 5, Holder: "h-1", Actor: "executor:exec-1"} }

	rt.Reset()
	res, err := e.svc.ApplySteps(ctx, Steps{Account: "acc-1", Cmd: cmd(OpClaim), Items: []pc.StepItem{{PayoutID: "po-1"}, {PayoutID: "po-2"}}})
	if err != nil || res[0].Err != nil || res[1].Payout.State != pc.Claimed {
		t.Fatalf("claim steps: %+v %v", res, err)
	}
	if n := rt.Count(); n != 2 {
		t.Fatalf("claim steps: %d round trips, want 2", n)
	}

	rt.Reset()
	p, err := e.svc.Apply(ctx, "po-1", cmd(OpSubmitting))
	if err != nil || p.State != pc.RailSubmitted {
		t.Fatalf("submitting: %+v %v", p, err)
	}
	if n := rt.Count(); n != 2 {
		t.Fatalf("submitting: %d round trips, want 2", n)
	}

	// A single claim reads the held amount (D-7) in the guard batch too.
	rt.Reset()
	if p, err := e.svc.Apply(ctx, "po-3", cmd(OpClaim)); err != nil || p.State != pc.Claimed {
		t.Fatalf("claim: %+v %v", p, err)
	}
	if n := rt.Count(); n != 2 {
		t.Fatalf("claim: %d round trips, want 2", n)
	}

	// Refused by guard 1: the guard batch, then ROLLBACK; the evidence is
	// written in a transaction of its own afterwards.
	before := e.counts(t)
	rt.Reset()
	_, err = e.svc.Apply(ctx, "po-2", Command{Op: OpSubmitting, Token: 4, Holder: "h-0", Actor: "executor:exec-1"})
	wantCode(t, err, problem.FencedOut)
	if n := rt.Count(); n < 2 {
		t.Fatalf("refused: %d round trips, want the guard batch and a rollback at least", n)
	}
	after := e.counts(t)
	if after["payout_event"] != before["payout_event"] || after["safety_event"] != before["safety_event"]+1 {
		t.Fatalf("refused: rows %v -> %v, want only the fenced_out evidence", before, after)
	}
	a, _ := e.svc.Account(ctx, "acc-1")
	if a.FenceToken != 5 || a.FenceHolder != "h-1" {
		t.Fatalf("fence after refusal: %d %s, want 5 h-1", a.FenceToken, a.FenceHolder)
	}
	e.assertLedger(t)
}

// Concurrent creations of one payout: exactly one creates it; every other
// answers with that very payout, including those whose statement ran
// before the creator committed and so could not see it.
func TestCreatePayoutConcurrentReplays(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	ctx := tctx(t)
	for round := range 5 {
		req := pc.CreatePayoutRequest{ID: fmt.Sprintf("po-%d", round), AccountID: "acc-1", Amount: 10, Currency: "EUR", BeneficiaryRef: "b"}
		const n = 8
		type answer struct {
			p       pc.Payout
			created bool
			err     error
		}
		answers := make(chan answer, n)
		start := make(chan struct{})
		for range n {
			go func() {
				<-start
				p, created, err := e.svc.CreatePayout(ctx, req, "operator:alice")
				answers <- answer{p, created, err}
			}()
		}
		close(start)
		var got []answer
		for range n {
			got = append(got, <-answers)
		}
		stored, err := e.svc.Payout(ctx, req.ID)
		if err != nil {
			t.Fatal(err)
		}
		creators := 0
		for _, a := range got {
			if a.err != nil || a.p != stored {
				t.Fatalf("round %d: %+v %v, want the stored payout %+v", round, a.p, a.err, stored)
			}
			if a.created {
				creators++
			}
		}
		if creators != 1 {
			t.Fatalf("round %d: %d callers created the payout, want 1", round, creators)
		}
		if c := e.eventCount(t, req.ID); c != 1 {
			t.Fatalf("round %d: %d creation events, want 1", round, c)
		}
	}
}
