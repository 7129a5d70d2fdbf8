package lockclient

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeService answers as a lock service for session s-1 with a TTL of ttl;
// keepalive, when set, answers the n-th keepalive (from 1) instead, and
// acquire runs before an acquire is granted.
type fakeService struct {
	ttl       time.Duration
	keepalive func(n int32, w http.ResponseWriter)
	acquire   func()
	kas       atomic.Int32
}

func (f *fakeService) start(t *testing.T) string {
	t.Helper()
	info := func() SessionInfo {
		return SessionInfo{SessionID: "s-1", Owner: "test", TTLMS: f.ttl.Milliseconds(), State: "ACTIVE"}
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.HasSuffix(r.URL.Path, "/keepalive"):
			n := f.kas.Add(1)
			if f.keepalive != nil {
				f.keepalive(n, w)
				return
			}
			_ = json.NewEncoder(w).Encode(info())
		case r.Method == http.MethodPost && r.URL.Path == "/v1/sessions", r.Method == http.MethodDelete:
			_ = json.NewEncoder(w).Encode(info())
		case strings.HasSuffix(r.URL.Path, "/acquire"):
			if f.acquire != nil {
				f.acquire()
			}
			key := strings.TrimSuffix(strings.TrimPrefix(r.URL.Path, "/v1/locks/"), "/acquire")
			_ = json.NewEncoder(w).Encode(GrantInfo{Key: key, Owner: "test", Token: 7, SessionID: "s-1", ServerExpiry: time.Now().Add(f.ttl)})
		case strings.HasSuffix(r.URL.Path, "/release"):
			_, _ = w.Write([]byte(`{}`))
		default:
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func quietLogger() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// openTest opens a session "test" with the service at url, closed when
// the test ends.
func openTest(t *testing.T, url string, opts ...Option) *Session {
	t.Helper()
	c, err := New(url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	s, err := c.Open(context.Background(), "test")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	return s
}

// heldAnswers is a transport that, once armed, gets the service's answer
// to the next keepalive and then holds it until released, whatever the
// request's deadline: the keepalive loop stuck after its answer arrived
// (a pause of the process, a stopped goroutine).
type heldAnswers struct {
	armed   atomic.Bool
	got     chan struct{} // closed once the held keepalive's answer arrived
	release chan struct{}
}

func (h *heldAnswers) RoundTrip(r *http.Request) (*http.Response, error) {
	if !strings.HasSuffix(r.URL.Path, "/keepalive") || !h.armed.CompareAndSwap(true, false) {
		return http.DefaultTransport.RoundTrip(r)
	}
	resp, err := http.DefaultTransport.RoundTrip(r.Clone(context.Background()))
	if err != nil {
		return nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	close(h.got)
	<-h.release
	resp.Body = io.NopCloser(strings.NewReader(string(body)))
	return resp, nil
}

// waitUntil polls cond, a minute at most.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited a minute for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// TestAnAnswerReadAfterTheDeadlineDoesNotRevive: the service acknowledged
// a keepalive, but the loop read the answer only after the session's
// deadline had passed, and nothing asked for the state meanwhile. The
// session is LOST (D-11: terminal, grant contexts cancelled), as State()
// would have said at the deadline. Before, the late answer moved the
// deadline on and left the session HEALTHY, its grants' contexts never
// cancelled.
func TestAnAnswerReadAfterTheDeadlineDoesNotRevive(t *testing.T) {
	t.Parallel()
	f := &fakeService{ttl: 3 * time.Second}
	h := &heldAnswers{got: make(chan struct{}), release: make(chan struct{})}
	h.armed.Store(true)
	s := openTest(t, f.start(t), WithTTL(f.ttl), WithLogger(quietLogger()), WithHTTPClient(&http.Client{Transport: h}))
	ctx := context.Background()
	g, err := s.TryAcquire(ctx, "payout:a")
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-h.got:
	case <-time.After(time.Minute):
		t.Fatal("no keepalive answered within a minute")
	}
	// Deadline() reads without judging the clock, as the loop's state
	// stands: the deadline of the open, not yet renewed.
	dl := s.Deadline()
	time.Sleep(time.Until(dl) + 50*time.Millisecond)
	close(h.release)
	waitUntil(t, "the loop to read the held answer", func() bool { return closed(s.Done()) || !s.Deadline().Equal(dl) })
	if st := s.State(); st != Lost {
		t.Fatalf("the answer was read %s after the deadline and the session is %v, want LOST", time.Since(dl).Round(time.Millisecond), st)
	}
	if !closed(s.Done()) || g.Context().Err() == nil || g.Valid() {
		t.Fatalf("LOST, but Done closed %v, grant context %v, grant valid %v", closed(s.Done()), g.Context().Err(), g.Valid())
	}
}

// TestSlowAnswersWithinTheIntervalKeepTheSession: every keepalive is
// answered after 0.6 of TTL/3, within its own bound (the safety margin is
// TTL/3 here). Keepalives go every TTL/3 from the send of the one before,
// as the deadline counts, so the session stays up. Before, the next
// keepalive waited TTL/3 after the answer, and with answers this slow the
// deadline passed between two acknowledged keepalives: LOST with nothing
// failing.
func TestSlowAnswersWithinTheIntervalKeepTheSession(t *testing.T) {
	t.Parallel()
	const ttl = 12 * time.Second // an answer may come 1.6 s late without a failure
	f := &fakeService{ttl: ttl}
	f.keepalive = func(_ int32, w http.ResponseWriter) {
		time.Sleep(ttl / 3 * 6 / 10)
		_ = json.NewEncoder(w).Encode(SessionInfo{SessionID: "s-1", Owner: "test", TTLMS: ttl.Milliseconds(), State: "ACTIVE"})
	}
	s := openTest(t, f.start(t), WithTTL(ttl), WithSafetyMargin(ttl/3), WithLogger(quietLogger()))
	// Three answers in: past the open's deadline (TTL - margin) and the
	// next one's.
	waitUntil(t, "three keepalives answered", func() bool { return f.kas.Load() >= 4 || s.State() == Lost })
	if st := s.State(); st == Lost {
		t.Fatalf("LOST after %d keepalives, each acknowledged within TTL/3: %v", f.kas.Load(), s.Err())
	}
}

// TestAGrantIsNotValidInJeopardy: D-11 starts no new step in JEOPARDY. A
// grant, one answered while the session is in JEOPARDY included, is not
// Valid until a keepalive gets through again. Before, Valid() was true in
// JEOPARDY, and an acquire sent while HEALTHY and answered in JEOPARDY
// handed out a grant to start work under.
func TestAGrantIsNotValidInJeopardy(t *testing.T) {
	t.Parallel()
	f := &fakeService{ttl: 12 * time.Second}
	failed, heal := make(chan struct{}), make(chan struct{})
	f.keepalive = func(n int32, w http.ResponseWriter) {
		switch n {
		case 1:
			close(failed)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		case 2:
			<-heal
		}
		_ = json.NewEncoder(w).Encode(SessionInfo{SessionID: "s-1", Owner: "test", TTLMS: f.ttl.Milliseconds(), State: "ACTIVE"})
	}
	f.acquire = func() { <-failed }
	s := openTest(t, f.start(t), WithTTL(f.ttl), WithLogger(quietLogger()))
	ctx := context.Background()
	g, err := s.Acquire(ctx, "payout:a", time.Minute) // answered once the keepalive failed
	if err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "JEOPARDY", func() bool { return s.State() == Jeopardy })
	if g.Valid() {
		t.Fatal("a grant is Valid while its session is in JEOPARDY")
	}
	close(heal)
	waitUntil(t, "HEALTHY again", func() bool { return s.State() == Healthy })
	if !g.Valid() {
		t.Fatal("the grant is not Valid once its session is HEALTHY again")
	}
}
