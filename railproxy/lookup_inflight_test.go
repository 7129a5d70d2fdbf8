package railproxy

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// A lookup while the proxy's own rail call for the payout is in flight
// records nothing: evidence gathered then says nothing about that call. The
// interleaving is forced: the rail holds the payment request until a
// lookup asks, and answers the lookup ("final, no payment") only after the
// forward has finished and recorded TIMEOUT (a 500 after acceptance). A
// lookup that asked the rail first and checked in-flight afterwards resolved
// the payout ABSENT from evidence gathered before the rail answered.
func TestLookupWhileForwardingRecordsNothing(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	conn := pgtest.Conn(t, dbURL)
	payStarted, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	releasePay := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(releasePay)
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.Method {
		case http.MethodPost: // the payment: accepted, held, then a 500
			close(payStarted)
			<-release
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"code":"internal","status":500,"title":"Internal error","detail":"after acceptance"}`))
		default: // the lookup: let the forward finish, then "final, nothing"
			releasePay()
			deadline := time.Now().Add(90 * time.Second)
			for time.Now().Before(deadline) {
				var n int
				if err := conn.QueryRow(context.Background(), `SELECT count(*) FROM rail_submission WHERE outcome IS NOT NULL`).Scan(&n); err == nil && n > 0 {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			_, _ = w.Write([]byte(`{"items":[],"final":true}`))
		}
	}))
	t.Cleanup(rail.Close)
	b := setup(t, options{railURL: rail.URL, dbURL: dbURL})
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
	l, err := b.recon.Lookup(ctxFor(t), "p-fly")
	releasePay()
	if err != nil {
		t.Fatal(err)
	}
	if err := <-submitted; err != nil {
		t.Fatalf("submit: %v", err)
	}
	if l.Recorded || l.Resolution != proxyclient.ResolutionNone || l.Final {
		t.Fatalf("lookup during the forward: %+v; want nothing recorded, not final", l)
	}
	rec, err := b.pc.Get(ctxFor(t), "p-fly")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Outcome != proxyclient.OutcomeTimeout || rec.Resolution != proxyclient.ResolutionNone {
		t.Fatalf("submission after the forward: outcome %q resolution %q; want TIMEOUT, unresolved", rec.Outcome, rec.Resolution)
	}
}
