package executor

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/obs"
	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// logLines are the JSON log lines of buf at level whose msg is msg.
func logLines(t *testing.T, buf *syncBuf, level, msg string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(buf.String(), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		if m["level"] == level && m["msg"] == msg {
			out = append(out, m)
		}
	}
	return out
}

// TestOutageLogsOnceThenRemindsThenEnds: the first failure is a WARN, the
// next ones within a minute are debug, one a minute later is a WARN again
// with the outage's length and failures, and the first answer an INFO; the
// wait before each try backs off, and starts again after an answer.
func TestOutageLogsOnceThenRemindsThenEnds(t *testing.T) {
	buf := newSyncBuf()
	log := slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	o := outage{bo: backoff{min: 200 * time.Millisecond, max: 5 * time.Second}}
	t0, now := time.Now(), time.Now()
	o.log.Now = func() time.Time { return now }
	var waits []time.Duration
	for i, at := range []time.Duration{0, time.Second, 30 * time.Second, 61 * time.Second, 62 * time.Second} {
		now = t0.Add(at)
		waits = append(waits, o.failed(log, "down", errors.New("refused")))
		if !o.down() {
			t.Fatalf("failure %d: no outage recorded", i)
		}
	}
	if n := len(logLines(t, buf, "WARN", "down")); n != 2 {
		t.Fatalf("%d WARN lines for 5 failures over 62 s; want 2 (the start, one reminder):\n%s", n, buf)
	}
	if n := len(logLines(t, buf, "DEBUG", "down")); n != 3 {
		t.Fatalf("%d debug lines; want 3:\n%s", n, buf)
	}
	if r := logLines(t, buf, "WARN", "down")[1]; r["down_for"] != "1m1s" || r["failures"] != float64(4) || r[obs.KeyError] != "refused" {
		t.Fatalf("reminder %v; want down_for 1m1s, failures 4, the error", r)
	}
	if waits[0] > 200*time.Millisecond || waits[4] < time.Second || waits[4] > 5*time.Second {
		t.Fatalf("waits %v; want a backoff from 200 ms up to 5 s", waits)
	}
	now = t0.Add(63 * time.Second)
	o.answered(log, "back")
	o.answered(log, "back")
	if b := logLines(t, buf, "INFO", "back"); len(b) != 1 || b[0]["failures"] != float64(5) || o.down() {
		t.Fatalf("answers after the outage logged %v; want one INFO with failures 5", b)
	}
	if w := o.failed(log, "down", errors.New("refused")); w > 200*time.Millisecond {
		t.Fatalf("a new outage waits %s first; want the backoff reset", w)
	}
	if n := len(logLines(t, buf, "WARN", "down")); n != 3 {
		t.Fatalf("a new outage after an answer gave %d WARN lines in all; want 3", n)
	}
}

// upSession is a lock session that is always healthy and grants nothing.
type upSession struct{ session }

func (upSession) Healthy() bool                   { return true }
func (upSession) Lost() bool                      { return false }
func (upSession) ID() string                      { return "s-up" }
func (upSession) Close(ctx context.Context) error { return nil }

type upLocker struct{}

func (upLocker) Open(context.Context, string) (session, error) { return upSession{}, nil }

// TestPaymentResourceOutageIsLoggedOnce: while GET /work gets no answer
// the executor logs one WARN, not one per poll, backs off between asks,
// and logs one INFO when the payment resource answers again.
func TestPaymentResourceOutageIsLoggedOnce(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	var asks atomic.Int32
	down.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/work" {
			http.NotFound(w, r)
			return
		}
		asks.Add(1)
		if down.Load() {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[],"next":""}`))
	}))
	defer srv.Close()
	buf := newSyncBuf()
	cfg := Config{Owner: "pay-down", PollInterval: 10 * time.Millisecond, CallTimeout: time.Minute,
		PaymentURL: srv.URL, ProxyURL: srv.URL, LockURL: srv.URL, Token: "t",
		Logger: slog.New(slog.NewJSONHandler(buf, nil)), locker: upLocker{}}
	_, stop := startExecutor(t, cfg)
	defer stop()
	waitFor(t, 2*time.Minute, "four asks for work without an answer", func() bool { return asks.Load() >= 4 })
	const warn = "could not ask the payment resource for work"
	if n := len(logLines(t, buf, "WARN", warn)); n != 1 {
		t.Fatalf("%d WARN lines %q for %d asks without an answer; want 1:\n%s", n, warn, asks.Load(), buf)
	}
	down.Store(false)
	const back = "the payment resource answers again: asking it for work as usual"
	waitFor(t, 2*time.Minute, "the INFO line of the payment resource's return", func() bool {
		return len(logLines(t, buf, "INFO", back)) == 1
	})
}

// TestProxyOutageIsLoggedOncePerRun: a worker whose lookups at the proxy
// get no usable answer logs one WARN for the outage, not one per retry,
// and one INFO when the proxy answers again.
func TestProxyOutageIsLoggedOncePerRun(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "hung up", http.StatusGatewayTimeout)
			return
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = w.Write([]byte(`{"type":"about:blank","title":"Not Found","status":404,"code":"not_found"}`))
	}))
	defer srv.Close()
	e := newBareExecutor()
	var err error
	if e.proxy, err = proxyclient.New(srv.URL, "t"); err != nil {
		t.Fatal(err)
	}
	buf := newSyncBuf()
	r := &run{e: e, account: "a", log: slog.New(slog.NewJSONHandler(buf, nil))}
	p := pc.Payout{ID: "po-1", AccountID: "a", State: pc.RailSubmitted}
	for i := range 5 {
		if _, _, err := r.lookup(p); !errors.Is(err, errTransient) {
			t.Fatalf("lookup %d: %v; want a transient failure", i, err)
		}
	}
	const warn = "no usable answer; will re-read and retry"
	if w := logLines(t, buf, "WARN", warn); len(w) != 1 || w[0][obs.KeyPayoutID] != "po-1" || w[0]["step"] != "lookup" {
		t.Fatalf("5 lookups without an answer logged %d WARN lines %q; want 1 naming the payout and step:\n%s", len(w), warn, buf)
	}
	down.Store(false)
	if _, found, err := r.lookup(p); err != nil || found {
		t.Fatalf("lookup once the proxy answers: found %v, %v; want none found", found, err)
	}
	if b := logLines(t, buf, "INFO", "the rail proxy answers again"); len(b) != 1 || b[0]["failures"] != float64(5) {
		t.Fatalf("the proxy's answer logged %v; want one INFO with failures 5:\n%s", b, buf)
	}
}

// TestAmbiguousTransitionLogsItsReason: the INFO line of a payout that
// turns RAIL_AMBIGUOUS says why, from the payout's error_code.
func TestAmbiguousTransitionLogsItsReason(t *testing.T) {
	buf := newSyncBuf()
	r := &run{e: newBareExecutor(), account: "a", log: slog.New(slog.NewJSONHandler(buf, nil))}
	r.transition("outcome", pc.Payout{ID: "po-1", State: pc.RailSubmitted},
		pc.Payout{ID: "po-1", State: pc.RailAmbiguous, ErrorCode: "no_recorded_outcome"})
	l := logLines(t, buf, "INFO", "payout transition")
	if len(l) != 1 || l[0]["to"] != string(pc.RailAmbiguous) || l[0]["error_code"] != "no_recorded_outcome" {
		t.Fatalf("logged %v; want one INFO line to RAIL_AMBIGUOUS with error_code no_recorded_outcome:\n%s", l, buf)
	}
}

// TestStopGivesUpASubmissionAfterTheShutdownGrace: a stop waits for a
// submission the proxy does not answer for --shutdown-grace, not for the
// whole proxy timeout, then gives it up, naming the payout; the submission
// ends without an answer, and nothing is sent again.
func TestStopGivesUpASubmissionAfterTheShutdownGrace(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{}, 1)
	var submits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		submits.Add(1)
		_, _ = io.Copy(io.Discard, r.Body) // so that the client's hang-up is seen
		arrived <- struct{}{}
		<-r.Context().Done() // hangs until the client gives up
	}))
	defer srv.Close()
	e := newBareExecutor()
	e.cfg.ProxyTimeout, e.cfg.ShutdownGrace = 10*time.Minute, 200*time.Millisecond
	var err error
	if e.proxy, err = proxyclient.New(srv.URL, "t"); err != nil {
		t.Fatal(err)
	}
	buf := newSyncBuf()
	e.log = slog.New(slog.NewJSONHandler(buf, nil))
	calls := 0
	r := &run{e: e, account: "a", g: &flakyGrant{key: "payout:a", calls: &calls}, log: e.log}
	p := pc.Payout{ID: "po-1", AccountID: "a", Amount: 100, Currency: "EUR", State: pc.RailSubmitted}
	done := make(chan error, 1)
	go func() {
		_, err := r.send(p, false)
		done <- err
	}()
	select {
	case <-arrived:
	case <-time.After(2 * time.Minute):
		t.Fatal("the submission never reached the proxy")
	}
	e.stop()
	select {
	case err := <-done:
		if err == nil || !noUsableAnswer(err) {
			t.Fatalf("the given-up submission ended with %v; want no usable answer (the proxy is asked next, never resent)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the submission was still waited for 30 s after the stop; want it given up after the 200 ms grace")
	}
	const warn = "shutdown grace passed: giving up waiting for submissions in flight at the rail proxy; their outcome is not known here, and whoever takes their accounts next asks the proxy first (the payouts stay RAIL_SUBMITTED)"
	waitFor(t, time.Minute, "the WARN line naming the payout", func() bool { return len(logLines(t, buf, "WARN", warn)) == 1 })
	if w := logLines(t, buf, "WARN", warn)[0]; len(w["payout_ids"].([]any)) != 1 || w["payout_ids"].([]any)[0] != "po-1" {
		t.Fatalf("WARN %v; want payout_ids [po-1]", w)
	}
	if n := submits.Load(); n != 1 || len(e.submitting) != 0 {
		t.Fatalf("%d submissions, %d still counted in flight; want 1, 0", n, len(e.submitting))
	}
}
