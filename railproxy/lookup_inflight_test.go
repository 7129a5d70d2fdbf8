package railproxy

import (
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// A lookup while the proxy's own rail call for the payout is in flight
// records nothing, and does not even ask the rail: evidence gathered then
// says nothing about that call. Only the in-flight check can refuse here:
// the intent is backdated past every age limit (the age check passes), and
// the rail answers the lookup "final, no payment" while it still holds the
// payment request, so the row still has no outcome and ABSENT would be
// written (the payout failed, its money released, and then the rail pays).
func TestLookupWhileForwardingRecordsNothing(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	payStarted, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releasePay := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releasePay)
	var looks atomic.Int32
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Method {
		case http.MethodPost: // the payment: accepted, held, then a 500
			close(payStarted)
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"code":"internal","status":500,"title":"Internal error","detail":"after acceptance"}`))
		default: // the lookup, answered at once: final, nothing
			looks.Add(1)
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"items":[],"final":true}`))
		}
	}))
	t.Cleanup(rail.Close)
	// A rail timeout long enough that the held call cannot end on its own
	// while the test runs.
	b := setup(t, options{railURL: rail.URL, dbURL: dbURL, railTimeout: 10 * time.Minute})
	submitted := make(chan error, 1)
	go func() {
		_, err := b.pc.Submit(ctxFor(t), sub("p-fly", "acc-1"), 3, holder(1))
		submitted <- err
	}()
	select {
	case <-payStarted:
	case <-time.After(90 * time.Second):
		t.Fatal("the proxy never called the rail")
	}
	// The intent older than its writer's window and this proxy's (both
	// 80 min: a send window of 7 and a rail call of 1 rail timeout).
	ctx := ctxFor(t)
	tx, err := pgtest.Conn(t, dbURL).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE rail_submission SET created_at = created_at - interval '3 hours' WHERE payout_id = 'p-fly'`); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	intent, err := b.proxy.st.forwarded(ctx, "p-fly")
	if err != nil {
		t.Fatal(err)
	}
	if old, err := b.proxy.st.olderThan(ctx, intent.ID, b.proxy.resolvableAge()); err != nil || !old {
		t.Fatalf("the backdated intent is not past the age limit (%v %v): the test would not test the in-flight check", old, err)
	}

	l, err := b.recon.Lookup(ctx, "p-fly")
	releasePay()
	if err != nil {
		t.Fatal(err)
	}
	if l.Recorded || l.Resolution != proxyclient.ResolutionNone || l.Final {
		t.Errorf("lookup during the forward: final %v, recorded %v, resolution %q, detail %q; want nothing recorded, not final", l.Final, l.Recorded, l.Resolution, l.Detail)
	}
	if n := looks.Load(); n != 0 {
		t.Errorf("the rail was asked %d time(s) while this proxy's own rail call ran, want 0", n)
	}
	select {
	case <-submitted: // its answer, or a 503 once the request deadline passed: the outcome is read below
	case <-time.After(2 * time.Minute):
		t.Fatal("the submission never ended")
	}
	var rec proxyclient.Record
	eventually(t, "the forward's outcome is recorded", func() (bool, error) {
		var err error
		rec, err = b.pc.Get(ctx, "p-fly")
		return err == nil && rec.Outcome != proxyclient.OutcomeNone, err
	})
	if rec.Outcome != proxyclient.OutcomeTimeout || rec.Resolution != proxyclient.ResolutionNone {
		t.Fatalf("submission after the forward: outcome %q resolution %q; want TIMEOUT, unresolved", rec.Outcome, rec.Resolution)
	}
}
