package payment

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/problem"
	pc "github.com/payouts/payouts/payment/paymentclient"
)

// A GET /work with wait_ms that finds no work is answered when a payout is
// created, not when the wait ends.
func TestWorkWaitIsAnsweredWhenAPayoutIsCreated(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	const wait = 8 * time.Second
	done := waitingCall(t, e.svc, func() ([]pc.WorkItem, error) { return e.exec.WaitForWork(bg, 10, wait) })
	e.payout(t, "po-1", "acc-1", 1)
	a := <-done
	if a.err != nil || len(a.items) != 1 || a.items[0].AccountID != "acc-1" {
		t.Fatalf("waiting GET /work: %+v %v, want acc-1", a.items, a.err)
	}
	if a.took >= wait-time.Second {
		t.Fatalf("waiting GET /work answered after %s: at the end of its %s wait, not when the payout was created", a.took, wait)
	}
}

// A resolution that makes an ambiguous payout actionable again (SETTLED:
// RAIL_ACKED, to be posted) answers a GET /work waiting for work, as a
// payout created does, not when the wait ends.
func TestWorkWaitIsAnsweredWhenAResolutionMakesWork(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	e.payout(t, "po-1", "acc-1", 10)
	e.drive(t, "po-1", pc.RailAmbiguous, 5, "holder-a")
	const wait = 8 * time.Second
	done := waitingCall(t, e.svc, func() ([]pc.WorkItem, error) { return e.exec.WaitForWork(bg, 10, wait) })
	if _, err := e.recon.Resolve(tctx(t), "po-1", 6, "holder-r", pc.ResolutionSettled, "rail: settled rl-1", "rl-1"); err != nil {
		t.Fatal(err)
	}
	a := <-done
	if a.err != nil || len(a.items) != 1 || a.items[0].AccountID != "acc-1" {
		t.Fatalf("waiting GET /work: %+v %v, want acc-1", a.items, a.err)
	}
	if a.took >= wait-time.Second {
		t.Fatalf("waiting GET /work answered after %s: at the end of its %s wait, not when the resolution made work", a.took, wait)
	}
}

// With no payout created, a waiting GET /work answers no work once the wait
// has passed; without wait_ms it answers at once.
func TestWorkWaitEndsEmpty(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	const wait = 300 * time.Millisecond
	start := time.Now()
	items, err := e.exec.WaitForWork(bg, 10, wait)
	if err != nil || len(items) != 0 {
		t.Fatalf("waiting GET /work with nothing to do: %+v %v", items, err)
	}
	if took := time.Since(start); took < wait {
		t.Fatalf("waiting GET /work answered after %s, before its %s wait", took, wait)
	}
	if n := counterValue(e.svc.m.workWaits); n < 1 {
		t.Fatalf("payouts_payment_work_waits_total = %v after a wait", n)
	}
	// A payout already there is answered at once, wait or not.
	e.payout(t, "po-1", "acc-1", 1)
	if items, err := e.exec.WaitForWork(bg, 10, pc.MaxWorkWait); err != nil || len(items) != 1 {
		t.Fatalf("waiting GET /work with work: %+v %v", items, err)
	}
}

// wait_ms outside 0..10000, payouts outside 0..10, or either not an
// integer is 400 invalid_request.
func TestWorkWaitRefusesBadValues(t *testing.T) {
	t.Parallel()
	e := setup(t)
	for _, q := range []string{"wait_ms=-1", "wait_ms=10001", "wait_ms=1s", "wait_ms=x", "payouts=-1", "payouts=11", "payouts=x"} {
		if code := e.getStatus(t, "/v1/work?"+q, executorBearer); code != http.StatusBadRequest {
			t.Errorf("GET /v1/work?%s: %d, want 400", q, code)
		}
	}
	// The executor reads the field of a refused payouts (an older payment
	// resource refuses it as an unknown parameter, naming it the same way).
	_, err := e.exec.WorkFor(tctx(t), pc.WorkQuery{Limit: 1, Payouts: pc.MaxWorkPayouts + 1})
	var field string
	if !problem.Has(err, problem.InvalidRequest) || !problem.From(err).Extension("field", &field) || field != "payouts" {
		t.Errorf("GET /v1/work?payouts=%d: %v (field %q), want invalid_request naming payouts", pc.MaxWorkPayouts+1, err, field)
	}
}

// A stopping service answers its calls waiting for work at once, so a
// draining server is not held for their waits.
func TestWorkWaitEndsWhenTheServiceStops(t *testing.T) {
	t.Parallel()
	e := setup(t)
	const wait = 8 * time.Second
	done := waitingCall(t, e.svc, func() ([]pc.WorkItem, error) { return e.exec.WaitForWork(bg, 10, wait) })
	start := time.Now()
	e.svc.stop()
	a := <-done
	if a.err != nil || len(a.items) != 0 {
		t.Fatalf("waiting GET /work as the service stops: %+v %v, want no work", a.items, a.err)
	}
	if took := time.Since(start); took >= wait-2*time.Second {
		t.Fatalf("a stopping service answered a waiting GET /work after %s: it waited out the %s", took, wait)
	}
	// Later calls do not wait at all.
	start = time.Now()
	if _, err := e.exec.WaitForWork(bg, 10, wait); err != nil || time.Since(start) >= wait-2*time.Second {
		t.Fatalf("GET /work?wait_ms on a stopped service: %v after %s", err, time.Since(start))
	}
}

// workAnswer is what a call waiting for work answered, and after how long.
type workAnswer struct {
	items []pc.WorkItem
	err   error
	took  time.Duration
}

// waitingCall runs call, a GET /work with wait_ms on svc, in the
// background and returns once svc reports it waiting for work; the call's
// answer comes on the channel returned.
func waitingCall(t *testing.T, svc *Service, call func() ([]pc.WorkItem, error)) <-chan workAnswer {
	t.Helper()
	waiting := make(chan struct{}, 1)
	hook := func() {
		select {
		case waiting <- struct{}{}:
		default:
		}
	}
	svc.onWorkWait.Store(&hook)
	done := make(chan workAnswer, 1)
	go func() {
		start := time.Now()
		items, err := call()
		done <- workAnswer{items, err, time.Since(start)}
	}()
	select {
	case <-waiting:
	case a := <-done:
		t.Fatalf("GET /work?wait_ms answered before it waited: %+v %v", a.items, a.err)
	case <-time.After(time.Minute):
		t.Fatal("GET /work?wait_ms never started to wait")
	}
	return done
}

// A payout created through one payment-resource process answers a call
// waiting for work on another process over the same paydb.
func TestWorkWaitIsAnsweredAcrossProcesses(t *testing.T) {
	t.Parallel()
	e := setup(t)
	e.account(t, "acc-1", 1_000)
	other, err := New(tctx(t), Config{DatabaseURL: e.dbURL, Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(other.Close)
	ctx, cancel := context.WithCancel(context.Background())
	listened := make(chan error, 1)
	go func() { listened <- other.listenForWork(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-listened; err != nil {
			t.Errorf("listenForWork: %v", err)
		}
	})
	const wait = 8 * time.Second
	done := waitingCall(t, other, func() ([]pc.WorkItem, error) { return other.WaitForWork(tctx(t), 10, nil, 0, wait) })
	e.payout(t, "po-1", "acc-1", 1)
	a := <-done
	if a.err != nil || len(a.items) != 1 || a.items[0].AccountID != "acc-1" {
		t.Fatalf("waiting GET /work on the other process: %+v %v, want acc-1", a.items, a.err)
	}
	if a.took >= wait-time.Second {
		t.Fatalf("the other process answered after %s, at the end of its %s wait: the creation was not announced", a.took, wait)
	}
	// A resolution that makes an ambiguous payout actionable again is
	// announced as well.
	e.drive(t, "po-1", pc.RailAmbiguous, 5, "holder-a")
	done = waitingCall(t, other, func() ([]pc.WorkItem, error) { return other.WaitForWork(tctx(t), 10, nil, 0, wait) })
	if _, err := e.recon.Resolve(tctx(t), "po-1", 6, "holder-r", pc.ResolutionSettled, "rail: settled rl-1", "rl-1"); err != nil {
		t.Fatal(err)
	}
	a = <-done
	if a.err != nil || len(a.items) != 1 || a.items[0].AccountID != "acc-1" {
		t.Fatalf("waiting GET /work on the other process after the resolution: %+v %v, want acc-1", a.items, a.err)
	}
	if a.took >= wait-time.Second {
		t.Fatalf("the other process answered after %s, at the end of its %s wait: the resolution was not announced", a.took, wait)
	}
}
