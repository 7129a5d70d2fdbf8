package railproxy

import (
	"context"
	"fmt"
	"io"
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

// silentRail never answers a payment (the proxy's rail timeout ends each
// call); a lookup finds no payment, as final. It counts both.
func silentRail(t *testing.T) (url string, payments, lookups func() int) {
	t.Helper()
	var mu sync.Mutex
	pays, looks := 0, 0
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		if r.Method == http.MethodPost {
			pays++
		} else {
			looks++
		}
		mu.Unlock()
		if r.Method == http.MethodPost {
			// Read to the end: only then does the server watch the
			// connection, and end the request when the proxy gives up.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[],"final":true}`))
	}))
	t.Cleanup(rail.Close)
	count := func(n *int) func() int {
		return func() int {
			mu.Lock()
			defer mu.Unlock()
			return *n
		}
	}
	return rail.URL, count(&pays), count(&looks)
}

// TestABatchItemLateForItsSlotIsNotSent: the items of a batch past the
// first maxBatchForwards wait for a slot. With a rail that never answers,
// the slots come free only when the rail timeout ends each call: with a
// send window no longer than the rail timeout, that is past the window, and
// the item is recorded REJECTED not_forwarded_in_time without reaching the
// rail. Sent that late, it could pay after another proxy's lookup, finding
// the rail empty and the intent old enough, had resolved it ABSENT.
func TestABatchItemLateForItsSlotIsNotSent(t *testing.T) {
	t.Parallel()
	railURL, calls, _ := silentRail(t)
	// The first maxBatchForwards items must start their calls within the
	// send window of the intents' transaction, on a loaded machine too.
	const railTimeout = 10 * time.Second
	b := setup(t, options{railURL: railURL, railTimeout: railTimeout, sendWindow: railTimeout})

	items := make([]proxyclient.BatchItem, maxBatchForwards+1)
	for i := range items {
		s := sub(fmt.Sprintf("p-late-%02d", i), "acc-late")
		items[i] = proxyclient.BatchItem{PayoutID: s.PayoutID, ClientRef: s.ClientRef, Amount: s.Amount, Currency: s.Currency, BeneficiaryRef: s.BeneficiaryRef}
	}
	res, err := b.pc.SubmitBatch(ctxFor(t), "acc-late", 3, holder(1), items)
	if err != nil {
		t.Fatal(err)
	}
	if got := calls(); got != maxBatchForwards {
		t.Errorf("the rail got %d payments, want %d: the item that waited for a slot past its send window was sent", got, maxBatchForwards)
	}
	// The slots are taken in no set order: one item, whichever came last,
	// is the late one.
	var late []string
	for i, r := range res {
		switch {
		case r.Err != nil:
			t.Fatalf("item %d: %v", i, r.Err)
		case r.Record.Outcome == proxyclient.OutcomeRejected && r.Record.ErrorCode == proxyclient.ErrorCodeNotForwardedInTime:
			late = append(late, r.Record.PayoutID)
		case r.Record.Outcome != proxyclient.OutcomeTimeout || r.Record.ErrorCode != "rail_timeout":
			t.Errorf("item %d: outcome %q error code %q, want TIMEOUT rail_timeout, or REJECTED %s", i, r.Record.Outcome, r.Record.ErrorCode, proxyclient.ErrorCodeNotForwardedInTime)
		}
	}
	if len(late) != 1 {
		t.Fatalf("items recorded REJECTED %s: %v, want exactly the one past the slots", proxyclient.ErrorCodeNotForwardedInTime, late)
	}
}

// TestLookupWaitsForTheSendWindowAndTheRailCall: a submission without
// outcome (its forward still running somewhere, or died) is resolved by a
// lookup only once older than the send window and the rail timeout
// together, judged before the rail is asked: until then a rail call may
// have started late in its window and still be running, or be still to
// come. Rows are planted with their age; the rail finds nothing, final.
func TestLookupWaitsForTheSendWindowAndTheRailCall(t *testing.T) {
	t.Parallel()
	railURL, _, lookups := silentRail(t)
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	const railTimeout, sendWindow = 30 * time.Second, 30 * time.Second
	b := setup(t, options{railURL: railURL, dbURL: dbURL, railTimeout: railTimeout, sendWindow: sendWindow})
	conn := pgtest.Conn(t, dbURL)
	plant := func(payoutID string, age time.Duration) {
		t.Helper()
		s := sub(payoutID, "acc-age")
		if _, err := conn.Exec(context.Background(), `
			INSERT INTO rail_submission (payout_id, account_id, fence_token, holder, client_ref, amount, currency, beneficiary_ref, created_at)
			VALUES ($1, $2, 3, 'session-1', $3, $4, $5, $6, now() - make_interval(secs => $7))`,
			s.PayoutID, s.AccountID, s.ClientRef, s.Amount, s.Currency, s.BeneficiaryRef, age.Seconds()); err != nil {
			t.Fatal(err)
		}
	}
	// Older than the rail timeout, and than the send window, but not than
	// both together (60 s): 29 s of margin for the lookup on a loaded machine.
	plant("p-age-young", sendWindow+time.Second)
	plant("p-age-old", 2*(sendWindow+railTimeout))

	young, err := b.recon.Lookup(ctxFor(t), "p-age-young")
	if err != nil {
		t.Fatal(err)
	}
	if young.Recorded || young.Resolution != proxyclient.ResolutionNone || young.Final {
		t.Errorf("lookup of a submission without outcome within its send window and rail timeout: %+v; want nothing recorded, not final", young)
	}
	if n := lookups(); n != 0 {
		t.Errorf("the rail was asked %d time(s) about the young submission, want 0: its answer could predate a call still to come", n)
	}
	old, err := b.recon.Lookup(ctxFor(t), "p-age-old")
	if err != nil {
		t.Fatal(err)
	}
	if !old.Recorded || old.Resolution != proxyclient.ResolutionAbsent {
		t.Errorf("lookup of a submission without outcome past its send window and rail timeout: %+v; want ABSENT recorded", old)
	}
}

// TestLookupWaitsForTheWritersSendWindow: proxies over one proxydb with
// different flags (a rolling change of --rail-timeout, a replica started
// otherwise). A submission another proxy is still sending is older than
// this proxy's send window and rail timeout, but not than its writer's:
// this proxy must not resolve it ABSENT (a payout failed and its money
// released while the rail is about to pay it), nor even ask the rail.
func TestLookupWaitsForTheWritersSendWindow(t *testing.T) {
	t.Parallel()
	// A rail that holds the slow proxy's payment until the test ends, then
	// fails it, and answers every lookup: nothing of it.
	var pays, looks atomic.Int32
	release := make(chan struct{})
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			pays.Add(1)
			_, _ = io.Copy(io.Discard, r.Body)
			select {
			case <-release:
				w.WriteHeader(http.StatusServiceUnavailable)
			case <-r.Context().Done():
			}
			return
		}
		looks.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"items":[],"final":true}`))
	}))
	t.Cleanup(rail.Close)
	defer close(release)
	railURL, payments, lookups := rail.URL, func() int { return int(pays.Load()) }, func() int { return int(looks.Load()) }
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	slow := setup(t, options{railURL: railURL, dbURL: dbURL, railTimeout: 20 * time.Second, sendWindow: 20 * time.Second})
	quick := setup(t, options{railURL: railURL, dbURL: dbURL, railTimeout: 2 * time.Second, sendWindow: 2 * time.Second})
	s := sub("p-writer", "acc-writer")
	go func() { _, _ = slow.pc.Submit(context.Background(), s, 3, holder(1)) }() // the rail never answers
	eventually(t, "the slow proxy's rail call is made", func() (bool, error) { return payments() == 1, nil })
	// Its intent 15 s old: past the quick proxy's 4 s, within the slow one's 40 s.
	conn := pgtest.Conn(t, dbURL)
	ctx := ctxFor(t)
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SET LOCAL session_replication_role = replica`); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `UPDATE rail_submission SET created_at = created_at - interval '15 seconds' WHERE payout_id = $1`, s.PayoutID); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := quick.recon.Lookup(ctx, s.PayoutID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Recorded || got.Resolution != proxyclient.ResolutionNone {
		t.Errorf("lookup through a proxy of a shorter window, of a submission another proxy may still send: %+v; want nothing recorded", got)
	}
	if n := lookups(); n != 0 {
		t.Errorf("the rail was asked %d time(s) about a submission still within its writer's send window, want 0", n)
	}
}

// A rail call that starts late, because the process stalled between the
// send window's check and the call, still ends by the time a lookup may
// take its submission as finished (its intent, the send window and the
// rail timeout), not a whole rail timeout after it started: past that age
// a lookup records ABSENT, and a call still running could then pay.
func TestARailCallStartedLateEndsByTheResolvableAge(t *testing.T) {
	t.Parallel()
	const railTimeout, sendWindow, stall = 4 * time.Second, time.Second, 3 * time.Second
	var ended atomic.Int64 // when the rail saw the call go (unix ns)
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		<-r.Context().Done() // never answers
		ended.Store(time.Now().UnixNano())
	}))
	t.Cleanup(rail.Close)
	b := setup(t, options{railURL: rail.URL, railTimeout: railTimeout, sendWindow: sendWindow,
		beforeRailCall: func() { time.Sleep(stall) }}) // the stall itself, not synchronisation
	rec, err := b.pc.Submit(ctxFor(t), sub("p-late", "acc-late"), 3, holder(1))
	if err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
		t.Fatalf("submit: %+v %v, want TIMEOUT", rec, err)
	}
	if ended.Load() == 0 {
		t.Fatal("the rail call never reached the rail: the stall exercised nothing")
	}
	limit := rec.CreatedAt.Add(sendWindow + railTimeout)
	if at := time.Unix(0, ended.Load()); at.After(limit.Add(time.Second)) {
		t.Fatalf("the rail call ended %s after its intent, past the resolvable age %s (and a second's slack)", at.Sub(rec.CreatedAt).Round(time.Millisecond), sendWindow+railTimeout)
	}
}
