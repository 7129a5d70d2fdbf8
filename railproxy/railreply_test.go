package railproxy

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// submitted is the proxy's answer to one submission, and when it came.
type submitted struct {
	rec proxyclient.Record
	err error
	at  time.Time
}

// submitAsync submits s in a goroutine of its own; the answer comes on the
// channel returned.
func submitAsync(t *testing.T, b *bundle, s proxyclient.Submission, token fencing.Token) <-chan submitted {
	t.Helper()
	ctx := ctxFor(t)
	out := make(chan submitted, 1)
	go func() {
		rec, err := b.pc.Submit(ctx, s, token, holder(1))
		out <- submitted{rec: rec, err: err, at: time.Now()}
	}()
	return out
}

// answer waits for a submission's answer.
func answer(t *testing.T, what string, ch <-chan submitted) submitted {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(2 * time.Minute):
		t.Fatalf("no answer to the submission of %s", what)
		return submitted{}
	}
}

// logLines are the proxy's log lines that carry every one of parts.
func logLines(b *bundle, parts ...string) []string {
	var out []string
	for _, l := range strings.Split(b.logs.String(), "\n") {
		all := l != ""
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// lockRow holds the forwarded submission of payoutID with SELECT ... FOR
// UPDATE in a transaction of the test's own, until the returned release is
// called (or the test ends): an outcome statement touching it waits.
func lockRow(t *testing.T, dbURL, payoutID string) (release func()) {
	t.Helper()
	ctx := ctxFor(t)
	tx, err := pgtest.Conn(t, dbURL).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var id int64
	if err := tx.QueryRow(ctx, `SELECT id FROM rail_submission WHERE payout_id = $1 AND outcome IS NULL FOR UPDATE`, payoutID).Scan(&id); err != nil {
		t.Fatalf("lock the submission of %s: %v", payoutID, err)
	}
	var once sync.Once
	release = func() { once.Do(func() { _ = tx.Rollback(context.Background()) }) }
	t.Cleanup(release)
	return release
}

// settlingRail is a rail that settles every payment it is sent, under
// rail reference "rl-" + its client reference; hold, when set, runs first
// and may change that reference, or stop the answer (false: the request is
// left without one).
func settlingRail(t *testing.T, hold func(r *http.Request, req railclient.PaymentRequest, ref *string) bool) string {
	t.Helper()
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req railclient.PaymentRequest
		if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&req) != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		ref := "rl-" + req.ClientRef
		if hold != nil && !hold(r, req, &ref) {
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(railclient.Payment{
			RailRef: ref, ClientRef: req.ClientRef, Amount: req.Amount, Currency: req.Currency,
			BeneficiaryRef: req.BeneficiaryRef, Status: railclient.StatusSettled, At: time.Now().UTC().Format(time.RFC3339Nano),
		})
	}))
	t.Cleanup(rail.Close)
	return rail.URL
}

// A rail answer with text PostgreSQL cannot hold (a NUL byte in its
// rail_ref) is an answer that cannot be read: TIMEOUT,
// rail_answer_unparseable, recorded at once. Taken as ACKED, it failed the
// group statement that wrote it, and with it the outcome of every other
// submission of that group, and was retried for 30 s before ending in a 503
// with no outcome. The interleaving is forced: a first submission's outcome
// statement waits on a row lock the test holds, while the bad answer and a
// clean one are queued for the next group, both of them in it.
func TestARailAnswerProxydbCannotHoldIsUnparseable(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	blockIn, blockFree := make(chan struct{}), make(chan struct{})
	var freeOnce sync.Once
	free := func() { freeOnce.Do(func() { close(blockFree) }) }
	t.Cleanup(free)
	var answered atomic.Int32
	railURL := settlingRail(t, func(r *http.Request, req railclient.PaymentRequest, ref *string) bool {
		switch req.ClientRef {
		case "po-p-block":
			close(blockIn)
			select {
			case <-blockFree:
				return true
			case <-r.Context().Done():
				return false
			}
		case "po-p-nul":
			*ref = "rl-\x00-1" // sent as "rl-\u0000-1": valid JSON
		}
		answered.Add(1)
		return true
	})
	b := setup(t, options{railURL: railURL, dbURL: dbURL})

	// The first group: p-block's outcome, waiting on the test's row lock.
	blockDone := submitAsync(t, b, sub("p-block", "acc-f1a"), 1)
	select {
	case <-blockIn:
	case <-time.After(90 * time.Second):
		t.Fatal("the proxy never called the rail for p-block")
	}
	unlock := lockRow(t, dbURL, "p-block")
	free()
	eventually(t, "p-block's outcome statement is under way", func() (bool, error) {
		return b.proxy.st.outcomes.Writing() == 1 && b.proxy.st.outcomes.Waiting() == 0 && answered.Load() == 0, nil
	})
	// The next group: the bad answer and a clean one, both waiting.
	nulDone := submitAsync(t, b, sub("p-nul", "acc-f1b"), 1)
	cleanDone := submitAsync(t, b, sub("p-clean", "acc-f1c"), 1)
	eventually(t, "both rail answers wait for the next group", func() (bool, error) {
		return answered.Load() == 2 && b.proxy.st.outcomes.Waiting() >= 2, nil
	})
	released := time.Now()
	unlock()

	nul := answer(t, "p-nul", nulDone)
	if nul.err != nil || nul.rec.Outcome != proxyclient.OutcomeTimeout || nul.rec.ErrorCode != "rail_answer_unparseable" || nul.rec.RailRef != "" {
		t.Errorf("submission the rail answered with a NUL in rail_ref: %+v %v; want TIMEOUT rail_answer_unparseable, no rail_ref", nul.rec, nul.err)
	}
	if took := nul.at.Sub(released); took > 20*time.Second {
		t.Errorf("the unreadable answer was recorded %s after the outcome statements could run; want at once, not after the 30 s retry budget", took)
	}
	clean := answer(t, "p-clean", cleanDone)
	if clean.err != nil || clean.rec.Outcome != proxyclient.OutcomeAcked || clean.rec.RailRef != "rl-po-p-clean" {
		t.Errorf("clean submission recorded with the unreadable one: %+v %v; want ACKED rl-po-p-clean", clean.rec, clean.err)
	}
	if block := answer(t, "p-block", blockDone); block.err != nil || block.rec.Outcome != proxyclient.OutcomeAcked {
		t.Errorf("first submission: %+v %v; want ACKED", block.rec, block.err)
	}
	if l := logLines(b, `"payout_id":"p-clean"`, "could not record the rail's answer"); len(l) != 0 {
		t.Errorf("the clean submission's outcome failed with the unreadable one's group: %q", l)
	}
	if n := counterValue(t, b.proxy.m.recordFailure); n != 0 {
		t.Errorf("outcome record failures %v, want 0", n)
	}
	if rec, err := b.pc.Get(ctxFor(t), "p-nul"); err != nil || rec.Outcome != proxyclient.OutcomeTimeout || rec.ErrorCode != "rail_answer_unparseable" {
		t.Errorf("recorded p-nul: %+v %v; want TIMEOUT rail_answer_unparseable", rec, err)
	}
}

// The resubmission path (fromRail): a payment the rail holds of the
// resubmitted payout whose text PostgreSQL cannot hold is not its outcome
// either: TIMEOUT, rail_answer_unparseable, recorded at once, nothing sent,
// and the duplicate_attempt evidence recorded with the rail's reference
// made storable.
func TestAResubmissionTheRailHoldsInTextProxydbCannotHoldIsUnparseable(t *testing.T) {
	t.Parallel()
	var pays atomic.Int32
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			pays.Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(railclient.Lookup{Final: true, Items: []railclient.Payment{{
			RailRef: "rl-\x00-7", ClientRef: "po-p-rs", Amount: 1250, Currency: "EUR", BeneficiaryRef: "ben-p-rs",
			Status: railclient.StatusSettled, At: time.Now().UTC().Format(time.RFC3339Nano),
		}}})
	}))
	t.Cleanup(rail.Close)
	b := setup(t, options{railURL: rail.URL})
	s := sub("p-rs", "acc-f1r")
	s.Resubmission = true
	start := time.Now()
	rec, err := b.pc.Submit(ctxFor(t), s, 1, holder(1))
	if err != nil || rec.Outcome != proxyclient.OutcomeTimeout || rec.ErrorCode != "rail_answer_unparseable" || rec.RailRef != "" {
		t.Fatalf("resubmission the rail holds a payment of with a NUL in rail_ref: %+v %v; want TIMEOUT rail_answer_unparseable", rec, err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("answered after %s; want at once, not after the 30 s retry budget", took)
	}
	if n := pays.Load(); n != 0 {
		t.Errorf("%d payment requests sent for a resubmission the rail holds, want 0", n)
	}
	var dup []proxyclient.SafetyEvent
	for _, e := range b.safetyEvents(t) {
		if e.Kind == proxyclient.KindDuplicateAttempt && e.PayoutID == s.PayoutID {
			dup = append(dup, e)
		}
	}
	if len(dup) != 1 || !strings.Contains(dup[0].Detail, "rl-?-7") {
		t.Errorf("duplicate_attempt evidence: %+v; want one, naming the rail's reference as rl-?-7", dup)
	}
}

// An outcome whose first recording attempt gave up waiting while its
// group was still being written is this call's own write when the retry
// finds it recorded: counted in submissions_total (PayoutsAmbiguousBurst
// reads it) and not logged as another writer's. The interleaving is
// forced: the test holds the submission's row locked past the attempt's
// timeout, so the group statement waits and lands once the lock goes.
func TestAnOutcomeItsOwnTimedOutAttemptWroteIsCounted(t *testing.T) {
	t.Parallel()
	railURL, entered, free := heldRail(t, &fakeClock{t: time.Now()}, http.MethodPost)
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	b := setup(t, options{railURL: railURL, dbURL: dbURL, outcomeAttempt: 2 * time.Second})
	done := submitAsync(t, b, sub("p-own", "acc-f3"), 1)
	select {
	case <-entered:
	case <-time.After(90 * time.Second):
		t.Fatal("the proxy never called the rail")
	}
	unlock := lockRow(t, dbURL, "p-own")
	free()
	eventually(t, "the first attempt to record the outcome gives up waiting", func() (bool, error) {
		return len(logLines(b, `"level":"WARN"`, "could not record the rail's answer; retrying")) > 0, nil
	})
	unlock()
	got := answer(t, "p-own", done)
	if got.err != nil || got.rec.Outcome != proxyclient.OutcomeAcked {
		t.Fatalf("submission: %+v %v; want ACKED", got.rec, got.err)
	}
	if n := counterValue(t, b.proxy.m.submissions.WithLabelValues(string(proxyclient.OutcomeAcked))); n != 1 {
		t.Errorf(`submissions_total{outcome="ACKED"} = %v, want 1`, n)
	}
	if n := counterValue(t, b.proxy.m.recordFailure); n != 0 {
		t.Errorf("outcome record failures %v, want 0", n)
	}
	if l := logLines(b, `"level":"ERROR"`); len(l) != 0 {
		t.Errorf("ERROR lines for an outcome the proxy itself recorded: %q", l)
	}
	if l := logLines(b, "submission outcome recorded", `"outcome":"ACKED"`); len(l) != 1 {
		t.Errorf("%d 'submission outcome recorded' lines, want 1", len(l))
	}
}

// A lookup resolves SETTLED only from a settled payment of the
// submission's own amount and currency, the match the rail's direct answer
// is held to (classify: rail_answer_mismatch). A settled payment of the
// client reference one unit higher moved money, but not this payout's:
// nothing is recorded, and the answer says what differs. A payment that
// matches still settles (the control).
func TestLookupDoesNotSettleFromAPaymentOfAnotherAmount(t *testing.T) {
	t.Parallel()
	rail := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost { // accepted, then an error: TIMEOUT
			w.Header().Set("Content-Type", "application/problem+json")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = w.Write([]byte(`{"code":"internal","status":500,"title":"Internal error","detail":"after acceptance"}`))
			return
		}
		ref := r.URL.Query().Get("client_ref")
		amount := int64(1250)
		if ref == "po-p-more" {
			amount++
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(railclient.Lookup{Final: true, Items: []railclient.Payment{{
			RailRef: "rl-" + ref, ClientRef: ref, Amount: amount, Currency: "EUR", BeneficiaryRef: "ben",
			Status: railclient.StatusSettled, At: time.Now().UTC().Format(time.RFC3339Nano),
		}}})
	}))
	t.Cleanup(rail.Close)
	b := setup(t, options{railURL: rail.URL})
	ctx := ctxFor(t)
	for _, id := range []string{"p-more", "p-same"} {
		rec, err := b.pc.Submit(ctx, sub(id, "acc-"+id), 1, holder(1))
		if err != nil || rec.Outcome != proxyclient.OutcomeTimeout {
			t.Fatalf("submit %s: %+v %v; want TIMEOUT", id, rec, err)
		}
		eventually(t, "the forward of "+id+" has ended", func() (bool, error) {
			_, running := b.proxy.inflight.Load(id)
			return !running, nil
		})
	}

	l, err := b.recon.Lookup(ctx, "p-more")
	if err != nil {
		t.Fatal(err)
	}
	if l.Recorded || l.Resolution != proxyclient.ResolutionNone || l.Submission.Resolution != proxyclient.ResolutionNone {
		t.Errorf("lookup finding a settled payment one unit higher: recorded %v, resolution %q, submission's resolution %q; want nothing recorded, no resolution",
			l.Recorded, l.Resolution, l.Submission.Resolution)
	}
	if !strings.Contains(l.Detail, "1251 EUR") || !strings.Contains(l.Detail, "1250 EUR") {
		t.Errorf("lookup detail %q; want it to say the rail settled 1251 EUR, not 1250 EUR", l.Detail)
	}
	if rec, err := b.pc.Get(ctx, "p-more"); err != nil || rec.Resolution != proxyclient.ResolutionNone || rec.ResolutionAt != nil {
		t.Errorf("record after the lookup: resolution %q (%v); want unresolved", rec.Resolution, err)
	}
	if n := len(logLines(b, `"level":"ERROR"`, `"payout_id":"p-more"`, "another amount or currency")); n != 1 {
		t.Errorf("%d ERROR lines about the mismatching payment, want 1", n)
	}

	same, err := b.recon.Lookup(ctx, "p-same")
	if err != nil || !same.Recorded || same.Resolution != proxyclient.ResolutionSettled {
		t.Errorf("lookup finding a settled payment of the same amount: recorded %v, resolution %q, detail %q (%v); want SETTLED recorded", same.Recorded, same.Resolution, same.Detail, err)
	}
}

// What proxydb cannot hold: a NUL byte or invalid UTF-8 in any of the
// rail's text (JSON decoding turns invalid UTF-8 into U+FFFD, so this is
// the check's own guard, whatever decodes the answer).
func TestUnstorableRailText(t *testing.T) {
	t.Parallel()
	ok := railclient.Payment{RailRef: "rl-1", ClientRef: "po-p", Amount: 1, Currency: "EUR", Status: railclient.StatusSettled, BeneficiaryRef: "b\u200bé", At: "t"}
	if f, _ := unstorable(ok); f != "" {
		t.Errorf("storable answer refused for its %s", f)
	}
	for _, tc := range []struct {
		field string
		set   func(*railclient.Payment)
	}{
		{"rail_ref", func(p *railclient.Payment) { p.RailRef = "r\x00" }},
		{"rail_ref", func(p *railclient.Payment) { p.RailRef = "r\xff" }},
		{"decline_code", func(p *railclient.Payment) { p.DeclineCode = "\xc3(" }},
		{"at", func(p *railclient.Payment) { p.At = "\x00" }},
	} {
		p := ok
		tc.set(&p)
		if f, _ := unstorable(p); f != tc.field {
			t.Errorf("%+v: unstorable field %q, want %q", p, f, tc.field)
		}
	}
}

// A rail answer proxydb does not take for longer than half a minute (an
// outage; forced here by a row lock of the test's that the outcome
// statement waits on) is still recorded once proxydb takes it, and the
// caller gets it: the answer exists nowhere else. The proxy used to give
// up after 30 s, answer 503 and leave the submission without outcome,
// an ambiguity for the reconciler, though the rail had answered.
func TestARailAnswerOutlastsAProxydbOutage(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDB(t, migrations.ProxyDB)
	asked, answerIt := make(chan struct{}), make(chan struct{})
	railURL := settlingRail(t, func(r *http.Request, _ railclient.PaymentRequest, _ *string) bool {
		close(asked)
		select {
		case <-answerIt:
			return true
		case <-r.Context().Done():
			return false
		}
	})
	b := setup(t, options{railURL: railURL, dbURL: dbURL, outcomeAttempt: time.Second})

	done := submitAsync(t, b, sub("p-outage", "acc-out"), 1)
	select {
	case <-asked:
	case <-time.After(90 * time.Second):
		t.Fatal("the proxy never called the rail")
	}
	unlock := lockRow(t, dbURL, "p-outage")
	close(answerIt)
	eventually(t, "the proxy fails to record the rail's answer", func() (bool, error) {
		return len(logLines(b, `"level":"WARN"`, "could not record the rail's answer")) > 0, nil
	})
	time.Sleep(35 * time.Second) // the outage: longer than the 30 s the proxy used to retry
	unlock()

	// The caller may have been answered 503 "the proxy will record the
	// outcome" meanwhile (the request's own time ran out): it is recorded.
	if got := answer(t, "p-outage", done); got.err == nil && (got.rec.Outcome != proxyclient.OutcomeAcked || got.rec.RailRef != "rl-po-p-outage") {
		t.Errorf("submission whose answer waited out a proxydb outage: %+v; want ACKED rl-po-p-outage", got.rec)
	}
	eventually(t, "the rail's answer is recorded", func() (bool, error) {
		rec, err := b.pc.Get(ctxFor(t), "p-outage")
		return err == nil && rec.Outcome != proxyclient.OutcomeNone, nil
	})
	if rec, err := b.pc.Get(ctxFor(t), "p-outage"); err != nil || rec.Outcome != proxyclient.OutcomeAcked || rec.RailRef != "rl-po-p-outage" {
		t.Errorf("recorded: %+v %v; want ACKED rl-po-p-outage", rec, err)
	}
	if n := counterValue(t, b.proxy.m.recordFailure); n != 0 {
		t.Errorf("outcome record failures %v, want 0", n)
	}
	eventually(t, "an INFO line says the answer was recorded after all", func() (bool, error) {
		return len(logLines(b, `"level":"INFO"`, "the rail's answer was recorded after proxydb did not take it")) == 1, nil
	})
	if l := logLines(b, `"level":"WARN"`, "could not record the rail's answer"); len(l) > 2 {
		t.Errorf("%d WARN lines for one answer over 35 s, want one and at most a reminder a minute:\n%s", len(l), strings.Join(l, "\n"))
	}
}
