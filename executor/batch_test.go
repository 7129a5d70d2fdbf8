package executor

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// isBatchSubmission reports whether r is a batch submission to the proxy
// (POST /v1/accounts/{id}/submissions).
func isBatchSubmission(r *http.Request) bool {
	return r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/accounts/") && strings.HasSuffix(r.URL.Path, "/submissions")
}

// runWithProxyFront creates n PENDING payouts of one account (fundedPage), runs an
// executor whose proxy calls go through front (which gets the real proxy
// to pass requests on to) until every payout is POSTED, and checks that
// the proxy recorded no safety event and the rail paid each payout exactly
// once.
func runWithProxyFront(t *testing.T, name string, n int, front func(real http.Handler) http.Handler) {
	t.Helper()
	s := setup(t)
	ctx := context.Background()
	ids := s.fundedPage(t, name, n)
	runWithProxyFrontUntil(t, s, name+"-exec", front, "every payout to be posted", s.allIn(t, ids, pc.Posted))
	events, err := s.prx.SafetyEvents(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range events.Items {
		t.Errorf("safety event at the proxy: %s for payout %s: %s", ev.Kind, ev.PayoutID, ev.Detail)
	}
	s.paidOnceEach(t, ids)
}

// runWithProxyFrontUntil runs an executor (owner) whose proxy calls go
// through front (which gets the real proxy to pass requests on to) until
// cond, then stops it.
func runWithProxyFrontUntil(t *testing.T, s *testBundle, owner string, front func(real http.Handler) http.Handler, what string, cond func() bool) {
	t.Helper()
	target, err := url.Parse(s.st.Ready.ProxyURL)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(front(httputil.NewSingleHostReverseProxy(target)))
	defer srv.Close()
	cfg := s.config(t, owner, io.Discard)
	cfg.ProxyURL = srv.URL
	runUntil(t, cfg, what, cond)
}

// paidOnceEach checks that the rail paid each of the payouts ids exactly
// once.
func (s *testBundle) paidOnceEach(t *testing.T, ids []string) {
	t.Helper()
	ctx := context.Background()
	report, err := s.rail.SettlementReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	paid := map[string]int{}
	for _, pm := range report {
		paid[pm.ClientRef]++
	}
	for _, id := range ids {
		p, err := s.pay.Payout(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if paid[p.ClientRef] != 1 {
			t.Errorf("payout %s (client ref %s) reached the rail %d times, want exactly once", id, p.ClientRef, paid[p.ClientRef])
		}
	}
}

// A batch submission the proxy refuses for its input before writing or
// forwarding anything (invalid_request, "forwarded": false) is sent again
// one payout at a time, so each payout gets its own answer: every payout
// of the refused batch is paid, once.
func TestBatchRefusedForInputIsSentOneAtATime(t *testing.T) {
	t.Parallel() // owns its stack and databases
	const n = 4
	var refused, singles atomic.Int32
	runWithProxyFront(t, "refused", n, func(real http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case isBatchSubmission(r) && refused.Add(1) == 1:
				problem.Write(w, problem.New(problem.InvalidRequest, "items: refused for the test").
					With(proxyclient.ForwardedExtension, false))
				return
			case r.Method == http.MethodPost && r.URL.Path == "/v1/submissions":
				singles.Add(1)
			}
			real.ServeHTTP(w, r)
		})
	})
	if refused.Load() == 0 {
		t.Fatal("no batch submission was made: the test exercised nothing")
	}
	if got := singles.Load(); got < n {
		t.Errorf("%d single submissions after the refused batch, want at least %d (one per payout)", got, n)
	}
}

// A batch submission answered with the wrong number of items (here: the
// proxy forwarded all of them, the answer lists one fewer) is not trusted
// item by item and never sent again: each payout is settled by asking the
// proxy what happened (D-4), and each is paid exactly once, with no
// duplicate_attempt at the proxy.
func TestBatchAnswerWithWrongItemCountIsNotResent(t *testing.T) {
	t.Parallel() // owns its stack and databases
	const n = 4
	var cut atomic.Int32
	runWithProxyFront(t, "short", n, func(real http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !isBatchSubmission(r) || cut.Add(1) != 1 {
				real.ServeHTTP(w, r)
				return
			}
			rec := httptest.NewRecorder()
			real.ServeHTTP(rec, r)
			var body struct {
				Items []json.RawMessage `json:"items"`
			}
			if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &body) != nil || len(body.Items) < 2 {
				t.Errorf("the batch submission to cut short was answered %d: %s", rec.Code, rec.Body.String())
				w.WriteHeader(http.StatusBadGateway)
				return
			}
			body.Items = body.Items[:len(body.Items)-1]
			var out bytes.Buffer
			if err := json.NewEncoder(&out).Encode(body); err != nil {
				t.Error(err)
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(out.Bytes())
		})
	})
	if cut.Load() == 0 {
		t.Fatal("no batch submission was made: the test exercised nothing")
	}
}

// A batch submission whose answer is lost after the proxy forwarded it is
// never sent again: its payouts go to the recovery path, which asks the
// proxy what happened (D-4), and each is paid exactly once. A resend would
// be refused by the proxy's own check (INV-02) and leave duplicate_attempt
// evidence: there must be none.
func TestLostBatchSubmissionAnswerIsNotResent(t *testing.T) {
	t.Parallel() // owns its stack and databases
	var dropped atomic.Int32
	runWithProxyFront(t, "lost", 5, func(real http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !isBatchSubmission(r) || dropped.Add(1) != 1 {
				real.ServeHTTP(w, r)
				return
			}
			// The batch reaches the proxy and is answered, but the answer
			// never reaches the executor.
			rec := httptest.NewRecorder()
			real.ServeHTTP(rec, r)
			if rec.Code != http.StatusOK {
				t.Errorf("the dropped batch submission was answered %d: %s", rec.Code, rec.Body.String())
			}
			conn, _, err := http.NewResponseController(w).Hijack()
			if err != nil {
				t.Errorf("hijack: %v", err)
				return
			}
			conn.Close()
		})
	})
	if dropped.Load() == 0 {
		t.Fatal("no batch submission was made: the test exercised nothing")
	}
}
