package executor

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	pc "github.com/payouts/payouts/payment/paymentclient"
)

// TestAStepWhoseAnswerWasLostIsNotSentAgainFromAStaleState: the outcome
// and post of a page commit at the payment resource but their answer is
// lost, and the payouts cannot be read back at first (503, paydb briefly
// away). The executor must not act on the state it last saw: sent again,
// the outcome would be refused in POSTED and recorded as a
// rejected_transition, the evidence of a replay that never was. It waits
// until the payouts can be read, finds them POSTED, and the payment
// resource records no safety event.
func TestAStepWhoseAnswerWasLostIsNotSentAgainFromAStaleState(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	ids := s.fundedPage(t, "lost-answer", 3)
	target, err := url.Parse(s.st.Ready.PaymentURL)
	if err != nil {
		t.Fatal(err)
	}
	real := httputil.NewSingleHostReverseProxy(target)
	var lost, refusedReads atomic.Int32
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/steps") {
			body, err := io.ReadAll(r.Body)
			if err != nil {
				t.Errorf("read a steps request: %v", err)
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if bytes.Contains(body, []byte(`"op":"outcome"`)) && lost.Add(1) == 1 {
				real.ServeHTTP(httptest.NewRecorder(), r) // lands; its answer is lost
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				conn.Close()
				return
			}
		}
		id, one := strings.CutPrefix(r.URL.Path, "/v1/payouts/")
		if one && lost.Load() > 0 && r.Method == http.MethodGet && !strings.Contains(id, "/") && refusedReads.Add(1) <= 3 {
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"type":"about:blank","title":"Service Unavailable","status":503,"code":"unavailable","detail":"paydb unavailable"}`))
			return
		}
		real.ServeHTTP(w, r)
	}))
	defer front.Close()

	cfg := s.config(t, "lost-answer-exec", io.Discard)
	cfg.PaymentURL = front.URL
	runUntil(t, cfg, "every payout to be posted", s.allIn(t, ids, pc.Posted))
	if lost.Load() == 0 || refusedReads.Load() == 0 {
		t.Fatalf("exercised nothing: %d outcome batches, %d reads refused", lost.Load(), refusedReads.Load())
	}
	events, err := s.pay.SafetyEvents(context.Background(), 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		t.Errorf("safety event at the payment resource, every payout paid once and posted: %s payout=%s: %s", ev.Kind, ev.PayoutID, ev.Detail)
	}
	s.paidOnceEach(t, ids)
}
