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
	"time"

	pc "github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// A batch submission that never reaches the proxy (its connection closes
// before the proxy sees it) leaves every payout unclear. The batch shares
// one wait for the proxy's records: once that has passed with a payout still
// unknown, the rest are left RAIL_SUBMITTED for the next pass, which asks
// once each (D-4) and submits them: the proxy is asked about a batch's
// payouts one wait's worth, not about ten times per payout.
func TestUnclearBatchSubmissionSharesOneWait(t *testing.T) {
	t.Parallel() // owns its stack and databases
	const n = 20
	var dropped, lookups atomic.Int32
	runWithProxyFront(t, "unclear", n, func(real http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			switch {
			case isBatchSubmission(r) && dropped.Add(1) == 1:
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("hijack: %v", err)
					return
				}
				conn.Close()
				return
			case r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/submissions/"):
				lookups.Add(1)
			}
			real.ServeHTTP(w, r)
		})
	})
	if dropped.Load() == 0 {
		t.Fatal("no batch submission was made: the test exercised nothing")
	}
	// One wait's polls (about ten over unknownSubmitWait) and one ask per
	// payout in the next pass, with room to spare; not ten per payout.
	if got, most := lookups.Load(), int32(2*n+10); got > most {
		t.Errorf("the proxy was asked %d times about the payouts of one unclear batch of %d, want at most %d", got, n, most)
	}
}

// poison makes the grants acquired before it was armed invalid for good:
// grants lost (or their session in jeopardy) while a call was in flight.
// Grants acquired after are valid again.
type poison struct {
	epoch   atomic.Int64 // advanced by arm
	refused atomic.Int32 // checks a poisoned grant failed
}

func (p *poison) arm() { p.epoch.Add(1) }

// poisonLocker hands out grants poison can make invalid.
type poisonLocker struct {
	locker
	p *poison
}

// poisoned is cfg's lock service with its grants subject to p.
func poisoned(t *testing.T, cfg Config, p *poison) poisonLocker {
	t.Helper()
	lk, err := newLockService(cfg.LockURL, cfg.Token, cfg.SessionTTL, 10*time.Second, cfg.Logger, nil)
	if err != nil {
		t.Fatal(err)
	}
	return poisonLocker{locker: lk, p: p}
}

func (l poisonLocker) Open(ctx context.Context, owner string) (session, error) {
	s, err := l.locker.Open(ctx, owner)
	if err != nil {
		return nil, err
	}
	return poisonSession{session: s, p: l.p}, nil
}

type poisonSession struct {
	session
	p *poison
}

func (s poisonSession) TryAcquire(ctx context.Context, key string) (grant, error) {
	epoch := s.p.epoch.Load()
	g, err := s.session.TryAcquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return poisonGrant{grant: g, p: s.p, epoch: epoch}, nil
}

func (s poisonSession) Acquire(ctx context.Context, key string, wait time.Duration) (grant, error) {
	epoch := s.p.epoch.Load()
	g, err := s.session.Acquire(ctx, key, wait)
	if err != nil {
		return nil, err
	}
	return poisonGrant{grant: g, p: s.p, epoch: epoch}, nil
}

type poisonGrant struct {
	grant
	p     *poison
	epoch int64
}

func (g poisonGrant) Valid() bool {
	if g.p.epoch.Load() > g.epoch {
		g.p.refused.Add(1)
		return false
	}
	return g.grant.Valid()
}

// countSingleSubmission counts r, when it is a single submission to the
// proxy, in marked when it is marked a resubmission, else in unmarked; its
// body is left for the proxy to read.
func countSingleSubmission(t *testing.T, r *http.Request, marked, unmarked *atomic.Int32) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/submissions" {
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		t.Error(err)
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var req proxyclient.SubmitRequest
	if err := json.Unmarshal(body, &req); err != nil {
		t.Error(err)
	}
	if req.Resubmission {
		marked.Add(1)
	} else {
		unmarked.Add(1)
	}
}

// frontOf serves target through a reverse proxy that shows each request to
// fn first.
func frontOf(t *testing.T, target string, fn func(r *http.Request)) string {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	real := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fn(r)
		real.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// The grant is checked between the batched claim and the batch submission,
// as before every step: a grant that became invalid during the claim call
// sends nothing to the rail proxy. The payouts stay RAIL_SUBMITTED and a
// later pass settles them (D-4): each asked about, submitted alone, paid
// once.
func TestBatchSubmissionChecksTheGrantAfterTheClaim(t *testing.T) {
	t.Parallel() // owns its stack and databases
	s := setup(t)
	const n = 4
	ids := s.fundedPage(t, "poison", n)
	var p poison
	var claims, batches atomic.Int32
	cfg := s.config(t, "poison-exec", io.Discard)
	cfg.PaymentURL = frontOf(t, s.st.Ready.PaymentURL, func(r *http.Request) {
		// The first batched claim: the grant turns invalid while it runs.
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/steps") && claims.Add(1) == 1 {
			p.arm()
		}
	})
	var resubmissions, unmarked atomic.Int32
	cfg.ProxyURL = frontOf(t, s.st.Ready.ProxyURL, func(r *http.Request) {
		if isBatchSubmission(r) {
			batches.Add(1)
		}
		countSingleSubmission(t, r, &resubmissions, &unmarked)
	})
	cfg.locker = poisoned(t, cfg, &p)
	runUntil(t, cfg, "every payout to be posted", s.allIn(t, ids, pc.Posted))
	if claims.Load() == 0 || p.refused.Load() == 0 {
		t.Fatalf("claims %d, checks the poisoned grant failed %d: the test exercised nothing", claims.Load(), p.refused.Load())
	}
	if got := batches.Load(); got != 0 {
		t.Errorf("%d batch submissions reached the proxy, want 0: the batch went out under a grant that had turned invalid", got)
	}
	// Each is resubmitted alone, marked so: the proxy asks the rail
	// before sending it (and answers 503, to come back, while the new
	// rail's answers are not final yet).
	if got, bad := resubmissions.Load(), unmarked.Load(); got < n || bad != 0 {
		t.Errorf("%d single submissions marked as resubmissions and %d not, want at least %d and 0", got, bad, n)
	}
	s.paidOnceEach(t, ids)
}
