package railproxy

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// TestShutdownWaitsForASubmissionPastItsGrace: a submission still being
// handled when the HTTP server's grace ends (here a resubmission whose
// rail lookup is slow) is waited for, with the rail call it then starts:
// Serve returning lets the process exit, and an exit between a committed
// intent and its rail call's outcome leaves a payout ambiguous that was
// on its way to being paid.
func TestShutdownWaitsForASubmissionPastItsGrace(t *testing.T) {
	t.Parallel()
	clock := &fakeClock{t: time.Now()}
	railURL, entered, free := heldRail(t, clock, http.MethodGet) // the resubmission's lookup

	logs := &syncBuffer{}
	s, err := New(ctxFor(t), Config{
		Addr: "127.0.0.1:0", Logger: obs.NewLogger(logs, slog.LevelDebug, "proxy"), Auth: testAuth(),
		DatabaseURL: pgtest.NewDB(t, migrations.ProxyDB), RailURL: railURL, RailToken: proxyBearer, RailTimeout: 20 * time.Second,
		shutdownGrace: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	addr, err := s.Listen()
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	pc, err := proxyclient.New("http://"+addr.String(), executorBearer)
	if err != nil {
		t.Fatal(err)
	}
	type answer struct {
		rec proxyclient.Record
		err error
	}
	answered := make(chan answer, 1)
	resub := sub("sd-1", "sd-acc")
	resub.Resubmission = true
	go func() {
		rec, err := pc.Submit(context.Background(), resub, 5, "h")
		answered <- answer{rec, err}
	}()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the resubmission never asked the rail")
	}
	stop()
	select {
	case err := <-served:
		t.Fatalf("Serve returned (%v) while a submission was still being handled", err)
	case <-time.After(2 * time.Second): // the grace is 50 ms: Serve would have returned long before
	}
	clock.Advance(2 * time.Minute) // the rail's answer about the reference is final
	free()
	a := <-answered
	if a.err != nil || a.rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("the resubmission handled across the shutdown: %+v, %v; want it forwarded and ACKED", a.rec, a.err)
	}
	select {
	case <-served:
	case <-time.After(time.Minute):
		t.Fatal("Serve did not return once the submission was done")
	}
	s.Close()
}
