package rail

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/fuzzhttp"
	"github.com/payouts/payouts/rail/railclient"
)

// startFuzzRail runs a rail stub (no faults) until the fuzz target ends.
func startFuzzRail(tb testing.TB) (*Server, string) {
	tb.Helper()
	s, url, _ := serveRail(tb, Config{SettlementWindow: time.Minute})
	return s, url
}

// railState is what a refused request must leave as it was.
type railState struct {
	payments, attempts int
	faults             railclient.Faults
}

func (s *Server) fuzzState() railState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return railState{payments: len(s.payments), attempts: len(s.attempts), faults: s.faults}
}

// FuzzPay sends malformed and valid bodies to POST /v1/payments. Every
// answer is a 2xx or a 4xx problem; a refused request pays nothing and
// records no attempt.
func FuzzPay(f *testing.F) {
	s, url := startFuzzRail(f)
	for _, b := range []string{
		`{"client_ref":"po-1","amount":500,"currency":"EUR","beneficiary_ref":"ben-1"}`,
		`{"client_ref":"po-1","amount":500,"currency":"EUR","beneficiary_ref":"DECLINE-ben"}`,
		`{"client_ref":"po-2","amount":999999999999999,"currency":"USD","beneficiary_ref":"b"}`,
		`{"client_ref":"","amount":500,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"  ","amount":500,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":0,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":-1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":1000000000000000,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":1.5,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":"1","currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":1,"currency":"eur","beneficiary_ref":"b"}`,
		`{"client_ref":"po-3","amount":1,"currency":"EUR"}`,
		`{"client_ref":"po-3","amount":1,"currency":"EUR","beneficiary_ref":"b","extra":true}`,
		`{"client_ref":"po-3","amount":1,"currency":"EUR","beneficiary_ref":"b"} {}`,
		`{"client_ref":"` + strings.Repeat("r", 201) + `","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"client_ref":"\u0000","amount":1,"currency":"EUR","beneficiary_ref":"\ud800"}`,
		``, `null`, `[]`, `{}`, `{`, `"x"`, "\xff\xfe",
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := s.fuzzState()
		a := fuzzhttp.Do(t, http.MethodPost, url+"/v1/payments", proxyToken, body)
		if a.OK() {
			return
		}
		if after := s.fuzzState(); after != before {
			t.Fatalf("payment %q was refused (%d %s) but changed the rail: %+v -> %+v", body, a.Status, a.Code, before, after)
		}
	})
}

// FuzzPutFaults sends malformed and valid bodies to PUT /v1/faults. Every
// answer is a 2xx or a 4xx problem; a refused update changes no fault.
func FuzzPutFaults(f *testing.F) {
	s, url := startFuzzRail(f)
	for _, b := range []string{
		`{"timeout_after_accept":0.1,"drop_before_accept":0.05,"error_after_accept":0.02,"error_before_accept":0.05,"latency_ms":2,"decline_beneficiary_prefix":"DECLINE"}`,
		`{"timeout_after_accept":0}`,
		`{"latency_ms":60000}`,
		`{"latency_ms":60001}`,
		`{"latency_ms":-1}`,
		`{"latency_ms":1.5}`,
		`{"timeout_after_accept":1.5}`,
		`{"drop_before_accept":-0.1}`,
		`{"error_before_accept":"0.5"}`,
		`{"error_after_accept":1e400}`,
		`{"decline_beneficiary_prefix":""}`,
		`{"decline_beneficiary_prefix":null}`,
		`{"nonsense":1}`,
		`{"latency_ms":1} {"latency_ms":2}`,
		``, `null`, `[]`, `{}`, `{`, `"x"`, "\xff\xfe",
	} {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before := s.fuzzState()
		a := fuzzhttp.Do(t, http.MethodPut, url+"/v1/faults", operatorToken, body)
		if a.OK() {
			return
		}
		if after := s.fuzzState(); after != before {
			t.Fatalf("faults %q were refused (%d %s) but changed the rail: %+v -> %+v", body, a.Status, a.Code, before, after)
		}
	})
}
