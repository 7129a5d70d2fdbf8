package railproxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Each rail behaviour maps to the right outcome, and the rail's own report
// shows what really happened.
func TestFaultModesMapToOutcomes(t *testing.T) {
	t.Parallel()
	// A rail timeout generous enough that every case the rail answers is
	// answered in time on a loaded machine; the cases whose subject is the
	// rail not answering use a proxy (with a rail of its own) that gives up
	// sooner, so as not to wait the long one out.
	b := setup(t, options{})
	short := setup(t, options{railTimeout: 5 * time.Second})
	cases := []struct {
		name        string
		short       bool // through the proxy with the short rail timeout
		faults      railclient.Faults
		beneficiary string
		outcome     proxyclient.Outcome
		code        string
		atRail      int
		railStatus  string
	}{
		{name: "clean", outcome: proxyclient.OutcomeAcked, atRail: 1, railStatus: railclient.StatusSettled},
		{name: "declined", beneficiary: "DECLINE-ben", outcome: proxyclient.OutcomeRejected, code: railclient.DeclineCodeBeneficiary, atRail: 1, railStatus: railclient.StatusDeclined},
		{name: "latency", faults: railclient.Faults{LatencyMS: 50}, outcome: proxyclient.OutcomeAcked, atRail: 1, railStatus: railclient.StatusSettled},
		{name: "timeout_after_accept", short: true, faults: railclient.Faults{TimeoutAfterAccept: 1}, outcome: proxyclient.OutcomeTimeout, code: "rail_timeout", atRail: 1, railStatus: railclient.StatusSettled},
		{name: "latency_beyond_timeout", short: true, faults: railclient.Faults{LatencyMS: 30_000}, outcome: proxyclient.OutcomeTimeout, code: "rail_timeout", atRail: 0},
		{name: "drop_before_accept", faults: railclient.Faults{DropBeforeAccept: 1}, outcome: proxyclient.OutcomeTimeout, code: "rail_connection_failed", atRail: 0},
		{name: "error_after_accept", faults: railclient.Faults{ErrorAfterAccept: 1}, outcome: proxyclient.OutcomeTimeout, code: "rail_http_500", atRail: 1, railStatus: railclient.StatusSettled},
		{name: "error_before_accept", faults: railclient.Faults{ErrorBeforeAccept: 1}, outcome: proxyclient.OutcomeTimeout, code: "rail_http_503", atRail: 0},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			b := b
			if tc.short {
				b = short
			}
			b.setFaults(t, tc.faults)
			s := sub("p-"+tc.name, "acc-fault-"+tc.name)
			if tc.beneficiary != "" {
				s.BeneficiaryRef = tc.beneficiary
			}
			rec, err := b.pc.Submit(ctxFor(t), s, 100+fencingToken(i), holder(i))
			if err != nil {
				t.Fatal(err)
			}
			if rec.Outcome != tc.outcome || rec.ErrorCode != tc.code || rec.OutcomeAt == nil {
				t.Fatalf("outcome %q code %q (at %v), want %q %q", rec.Outcome, rec.ErrorCode, rec.OutcomeAt, tc.outcome, tc.code)
			}
			if (tc.outcome == proxyclient.OutcomeTimeout) == (rec.RailRef != "") {
				t.Fatalf("rail_ref %q with outcome %s: a definitive answer carries the rail's reference, an ambiguous one none", rec.RailRef, rec.Outcome)
			}
			got := b.atRail(t, s.ClientRef)
			if len(got) != tc.atRail {
				t.Fatalf("rail holds %d payments, want %d: %+v", len(got), tc.atRail, got)
			}
			if tc.atRail == 1 && got[0].Status != tc.railStatus {
				t.Fatalf("rail status %q, want %q", got[0].Status, tc.railStatus)
			}
			if rec.RailRef != "" && got[0].RailRef != rec.RailRef {
				t.Fatalf("recorded rail_ref %q, rail says %q", rec.RailRef, got[0].RailRef)
			}
		})
	}
	b.setFaults(t, railclient.Faults{})
	short.setFaults(t, railclient.Faults{})
}

func fencingToken(i int) fencing.Token { return fencing.Token(i) }

// A rail answer that cannot be read is TIMEOUT, never ACKED or REJECTED by
// guess.
func TestUnreadableRailAnswerIsTimeout(t *testing.T) {
	t.Parallel()
	answers := map[string]string{
		"truncated":      `{"rail_ref":"r-1","status":"sett`,
		"unknown_status": `{"rail_ref":"r-1","client_ref":"po-p-unknown_status","amount":1250,"currency":"EUR","status":"pending"}`,
		"other_payment":  `{"rail_ref":"r-1","client_ref":"po-someone-else","amount":1250,"currency":"EUR","status":"settled"}`,
		"no_rail_ref":    `{"client_ref":"po-p-no_rail_ref","amount":1250,"currency":"EUR","status":"settled"}`,
	}
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req railclient.PaymentRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(answers[strings.TrimPrefix(req.ClientRef, "po-p-")]))
	}))
	t.Cleanup(rail.Close)
	b := setup(t, options{railURL: rail.URL})
	for name := range answers {
		rec, err := b.pc.Submit(ctxFor(t), sub("p-"+name, "acc-"+name), 1, holder(1))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if rec.Outcome != proxyclient.OutcomeTimeout || rec.RailRef != "" {
			t.Errorf("%s: outcome %q rail_ref %q, want TIMEOUT without a rail reference", name, rec.Outcome, rec.RailRef)
		}
	}
}

// Bad input is a 4xx naming the field, and writes nothing.
func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	valid := map[string]any{
		"payout_id": "p-1", "account_id": "acc-1", "token": 5, "holder": "s-1",
		"client_ref": "po-p-1", "amount": 100, "currency": "EUR", "beneficiary_ref": "ben-1",
	}
	with := func(k string, v any) string {
		m := map[string]any{}
		for kk, vv := range valid {
			m[kk] = vv
		}
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
		raw, _ := json.Marshal(m)
		return string(raw)
	}
	cases := []struct{ name, body, mention string }{
		{"missing token", with("token", nil), "token"},
		{"zero token", with("token", 0), "token"},
		{"negative token", with("token", -3), "token"},
		{"fractional token", with("token", 1.5), "token"},
		{"string token", with("token", "7"), "token"},
		{"empty client_ref", with("client_ref", ""), "client_ref"},
		{"missing payout_id", with("payout_id", nil), "payout_id"},
		{"missing holder", with("holder", nil), "holder"},
		{"zero amount", with("amount", 0), "amount"},
		{"negative amount", with("amount", -100), "amount"},
		{"huge amount", with("amount", int64(1e15)), "amount"},
		{"bad currency", with("currency", "eur"), "currency"},
		{"client_ref of another payout", with("client_ref", "po-p-2"), "client_ref"},
		{"client_ref not derived from the payout", with("client_ref", "whatever"), "client_ref"},
		{"payout_id not an id", with("payout_id", "p 1"), "payout_id"},
		{"account_id not an id", with("account_id", "acc/1"), "account_id"},
		{"beneficiary_ref over the shared limit", with("beneficiary_ref", strings.Repeat("b", 201)), "beneficiary_ref"},
		{"control character in holder", with("holder", "s\n1"), "holder"},
		{"unknown field", with("tokn", 5), "tokn"},
		{"malformed", `{"payout_id":`, "malformed"},
		{"empty", ``, "empty"},
		{"trailing data", with("amount", 100) + `{}`, "after"},
	}
	for _, tc := range cases {
		status, body := postRaw(t, b.url+"/v1/submissions", tc.body)
		if status != http.StatusBadRequest || !strings.Contains(body, `"code":"invalid_request"`) || !strings.Contains(body, tc.mention) {
			t.Errorf("%s: %d %s; want 400 invalid_request mentioning %q", tc.name, status, body, tc.mention)
		}
	}
	ctx := ctxFor(t)
	if p, err := b.pc.List(ctx, "", 0); err != nil || len(p.Items) != 0 {
		t.Fatalf("rows after bad input: %+v %v", p, err)
	}
	if p, err := b.pc.HighWater(ctx, "", 0); err != nil || len(p.Items) != 0 {
		t.Fatalf("high-water after bad input: %+v %v", p, err)
	}
	if ev := b.safetyEvents(t); len(ev) != 0 {
		t.Fatalf("safety events after bad input: %+v", ev)
	}
	for _, q := range []string{"limit=0", "limit=x", "after=-1", "after=abc"} {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/v1/submissions?"+q, nil)
		req.Header.Set("Authorization", "Bearer "+executorBearer)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("GET /v1/submissions?%s: %d, want 400", q, resp.StatusCode)
		}
	}
	if _, err := b.pc.Get(ctx, "never"); !problem.Has(err, problem.NotFound) {
		t.Fatalf("Get of an unknown payout: %v, want not_found", err)
	}
	if all, err := b.pc.GetAll(ctx, "never"); err != nil || len(all) != 0 {
		t.Fatalf("GetAll of an unknown payout: %+v %v", all, err)
	}
}

// leaveWhileTheRailHolds calls submit and, once its rail call has reached
// the rail (entered), goes away: the caller must get no answer.
func leaveWhileTheRailHolds(t *testing.T, entered <-chan struct{}, submit func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(ctxFor(t))
	defer cancel()
	submitted := make(chan error, 1)
	go func() { submitted <- submit(ctx) }()
	select {
	case <-entered:
	case err := <-submitted:
		t.Fatalf("answered before reaching the rail: %v", err)
	case <-time.After(90 * time.Second):
		t.Fatal("the submission never reached the rail")
	}
	cancel() // the caller goes away while the rail call is in flight
	if err := <-submitted; !errors.Is(err, httpx.ErrTransport) {
		t.Fatalf("impatient caller: %v, want no answer", err)
	}
}

// Once the intent is committed, the caller going away does not stop the
// forwarding: the proxy finishes the rail call and records the outcome.
func TestForwardingIsDetachedFromTheCaller(t *testing.T) {
	t.Parallel()
	// The rail holds the submission's call until freed: the caller goes
	// away only once the intent is committed and its rail call under way
	// (however slow the machine), and the rail answers only after that.
	railURL, entered, free := heldRail(t, &fakeClock{t: time.Now()}, http.MethodPost)
	b := setup(t, options{railURL: railURL})
	s := sub("p-detached", "acc-detached")
	leaveWhileTheRailHolds(t, entered, func(ctx context.Context) error {
		_, err := b.pc.Submit(ctx, s, 3, holder(3))
		return err
	})
	free()
	eventually(t, "the outcome is recorded", func() (bool, error) {
		rec, err := b.pc.Get(ctxFor(t), s.PayoutID)
		if problem.Has(err, problem.NotFound) {
			return false, nil
		}
		return rec.Outcome == proxyclient.OutcomeAcked, err
	})
	if got := b.atRail(t, s.ClientRef); len(got) != 1 {
		t.Fatalf("rail holds %d payments, want 1", len(got))
	}
}

func TestListPages(t *testing.T) {
	t.Parallel()
	b := setup(t, options{})
	ctx := ctxFor(t)
	for i, p := range []string{"a", "b", "c"} {
		if _, err := b.pc.Submit(ctx, sub("p-"+p, "acc-"+p), fencingToken(i+1), holder(i)); err != nil {
			t.Fatal(err)
		}
	}
	var ids []string
	after := ""
	for {
		page, err := b.pc.List(ctx, after, 2)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Items {
			ids = append(ids, r.PayoutID)
		}
		if page.Next == "" {
			break
		}
		after = page.Next
	}
	if strings.Join(ids, ",") != "p-a,p-b,p-c" {
		t.Fatalf("paged ids %v", ids)
	}
	hw, err := b.pc.HighWater(ctx, "acc-a", 10)
	if err != nil || len(hw.Items) != 2 || hw.Items[0].AccountID != "acc-b" {
		t.Fatalf("high-water after acc-a: %+v %v", hw, err)
	}
}
