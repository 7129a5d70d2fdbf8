package railproxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/fuzzhttp"
	"github.com/payouts/payouts/dev/pgtest"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/migrations"
	"github.com/payouts/payouts/rail"
	"github.com/payouts/payouts/rail/railclient"
)

// proxyState is what a refused submission may change: nothing, except the
// evidence of a fenced_out (a FENCED row and safety events) or of a
// duplicate_attempt (a safety event).
type proxyState struct {
	forwarded, fencedRows, safetyEvents int64
	highWater                           string
	railPayments                        int
}

// runFuzzServer serves start until the fuzz target ends.
func runFuzzServer(tb testing.TB, start func(ctx context.Context) error) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- start(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("server: %v", err)
		}
	})
}

// fuzzFixture is the forwarded submission every proxy fuzz target starts with.
const fuzzFixture = `{"payout_id":"fz-done","account_id":"fz-acc","token":5,"holder":"h-5","client_ref":"po-fz-done","amount":100,"currency":"EUR","beneficiary_ref":"b"}`

// startFuzzProxy starts a proxy in front of a rail stub for a fuzz target,
// with one forwarded submission (fz-done, account fz-acc, token 5, holder
// h-5), and returns its base URL and a reader of what a refusal must not
// change.
func startFuzzProxy(f *testing.F) (string, func(testing.TB) proxyState) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	f.Cleanup(cancel)
	dbURL := pgtest.NewDB(f, migrations.ProxyDB)
	log := obs.NewLogger(io.Discard, slog.LevelInfo, "fuzz")
	rs, err := rail.New(rail.Config{Addr: "127.0.0.1:0", Logger: log, Auth: testAuth(), SettlementWindow: time.Minute, Faults: railclient.DefaultFaults()})
	if err != nil {
		f.Fatal(err)
	}
	raddr, err := rs.Listen()
	if err != nil {
		f.Fatal(err)
	}
	runFuzzServer(f, rs.Serve)
	railURL := "http://" + raddr.String()
	railc, err := railclient.New(railURL, operatorBearer)
	if err != nil {
		f.Fatal(err)
	}
	ps, err := New(ctx, Config{Addr: "127.0.0.1:0", Logger: log, Auth: testAuth(), DatabaseURL: dbURL, RailURL: railURL, RailToken: proxyBearer, RailTimeout: 20 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	paddr, err := ps.Listen()
	if err != nil {
		f.Fatal(err)
	}
	runFuzzServer(f, func(ctx context.Context) error {
		defer ps.Close()
		return ps.Serve(ctx)
	})
	base := "http://" + paddr.String()

	// A forwarded submission at token 5, for duplicates and stale tokens.
	if a := fuzzhttp.Do(f, http.MethodPost, base+"/v1/submissions", executorBearer, []byte(fuzzFixture)); !a.OK() {
		f.Fatalf("fixture submission: %d %s", a.Status, a.Body)
	}

	conn := pgtest.Conn(f, dbURL)
	snapshot := func(t testing.TB) proxyState {
		var s proxyState
		if err := conn.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM rail_submission WHERE outcome IS DISTINCT FROM 'FENCED'),
			(SELECT count(*) FROM rail_submission WHERE outcome = 'FENCED'),
			(SELECT count(*) FROM safety_event),
			(SELECT coalesce(string_agg(account_id || '=' || token || '/' || holder, ',' ORDER BY account_id), '') FROM account_high_water)`).
			Scan(&s.forwarded, &s.fencedRows, &s.safetyEvents, &s.highWater); err != nil {
			t.Fatalf("read proxydb: %v", err)
		}
		rep, err := railc.SettlementReport(ctx)
		if err != nil {
			t.Fatalf("rail settlement report: %v", err)
		}
		s.railPayments = len(rep)
		return s
	}

	return base, snapshot
}

// FuzzSubmit sends malformed and valid bodies to POST /v1/submissions of a
// proxy in front of a rail stub. Every answer is a 2xx or a 4xx problem;
// a refused submission forwards nothing and moves no high-water mark.
func FuzzSubmit(f *testing.F) {
	base, snapshot := startFuzzProxy(f)
	submitURL := base + "/v1/submissions"

	for _, s := range []string{
		fuzzFixture,
		`{"payout_id":"fz-1","account_id":"fz-acc","token":5,"holder":"h-5","client_ref":"po-fz-1","amount":100,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-2","account_id":"fz-acc","token":4,"holder":"h-4","client_ref":"po-fz-2","amount":100,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-3","account_id":"fz-acc","token":5,"holder":"h-other","client_ref":"po-fz-3","amount":100,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-4","account_id":"fz-new","token":1,"holder":"h-1","client_ref":"po-fz-4","amount":999999999999999,"currency":"USD","beneficiary_ref":"DECLINE-b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":0,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":9007199254740992,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":0,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1000000000000000,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1,"currency":"eur","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":" ","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1,"currency":"EUR"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":"7","holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7.5,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b","extra":1}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"} {}`,
		`{"payout_id":"fz-5","account_id":"fz-acc","token":-7,"holder":"h","client_ref":"r","amount":-1,"currency":"EUR","beneficiary_ref":"b"}`,
		`{"payout_id":"\u0000","account_id":"fz-acc","token":7,"holder":"h","client_ref":"r","amount":1,"currency":"EUR","beneficiary_ref":"b"}`,
		``, `null`, `[]`, `{}`, `{`, `"x"`, "\xff\xfe",
	} {
		f.Add([]byte(s))
	}

	f.Fuzz(func(t *testing.T, body []byte) {
		before := snapshot(t)
		a := fuzzhttp.Do(t, http.MethodPost, submitURL, executorBearer, body)
		if a.OK() {
			return
		}
		after := snapshot(t)
		want := before
		switch a.Code {
		case problem.FencedOut:
			// The evidence of the refusal: a FENCED row and its safety
			// event (plus token_regression when the holder differs).
			want.fencedRows++
			if d := after.safetyEvents - before.safetyEvents; d == 1 || d == 2 {
				want.safetyEvents = after.safetyEvents
			}
		case problem.SubmissionExists:
			want.safetyEvents++
		}
		if after != want {
			t.Fatalf("submission %q was refused (%d %s) but changed state: %+v -> %+v (allowed: %+v)", body, a.Status, a.Code, before, after, want)
		}
	})
}

// FuzzProxyRequests sends malformed and valid bodies, under malformed and
// valid path ids, to the proxy's other endpoints that decode one: the batch
// submission of an account and the lookup. Every answer is a 2xx or a 4xx
// problem; a refusal forwards nothing, moves no high-water mark and
// records nothing but the evidence of a fenced-out or duplicate attempt.
func FuzzProxyRequests(f *testing.F) {
	base, snapshot := startFuzzProxy(f)
	type route struct{ path, token string } // path: %s is the (escaped) path argument
	routes := []route{{"/v1/accounts/%s/submissions", executorBearer}, {"/v1/submissions/%s/lookup", reconcilerBearer}}
	item := func(id string) string {
		return `{"payout_id":"` + id + `","client_ref":"po-` + id + `","amount":100,"currency":"EUR","beneficiary_ref":"b"}`
	}
	seeds := []struct {
		route     int
		arg, body string
	}{
		{0, "fz-acc", `{"token":5,"holder":"h-5","items":[` + item("fz-b1") + `]}`},
		{0, "fz-acc", `{"token":4,"holder":"h-4","items":[` + item("fz-b2") + `]}`},
		{0, "fz-acc", `{"token":5,"holder":"h-other","items":[` + item("fz-b3") + `]}`},
		{0, "fz-acc", `{"token":6,"holder":"h-6","items":[` + item("fz-done") + `]}`},
		{0, "fz-acc", `{"token":6,"holder":"h-6","items":[` + item("fz-b4") + `,` + item("fz-b4") + `]}`},
		{0, "fz-acc", `{"token":6,"holder":"h-6","items":[]}`},
		{0, "fz-acc", `{"token":6,"holder":"h-6","items":[{"payout_id":"fz-b5","client_ref":"po-other","amount":1,"currency":"EUR","beneficiary_ref":"b"}]}`},
		{0, "fz-acc", `{"token":6,"holder":"h-6","items":[{"payout_id":"fz-b6","client_ref":"po-fz-b6","amount":0,"currency":"EUR","beneficiary_ref":"b"}]}`},
		{0, "fz-acc", `{"token":6,"holder":"h-6","items":[{"payout_id":5}]}`},
		{0, "", `{"token":6,"holder":"h-6","items":[` + item("fz-b7") + `]}`},
		{0, "bad acc", `{"token":6,"holder":"h-6","items":[` + item("fz-b7") + `]}`},
		{1, "fz-done", ``},
		{1, "fz-done", `{}`},
		{1, "fz-done", `{"x":1}`},
		{1, "no-such", `{}`},
		{1, "", `{}`},
	}
	for _, s := range seeds {
		f.Add(uint8(s.route), s.arg, []byte(s.body))
	}
	for _, body := range []string{`null`, `[]`, `{`, `"x"`, "\xff\xfe", `{"token":"5","holder":"h-5","items":[]}`} {
		for i := range routes {
			f.Add(uint8(i), "fz-acc", []byte(body))
		}
	}
	f.Fuzz(func(t *testing.T, idx uint8, arg string, body []byte) {
		r := routes[int(idx)%len(routes)]
		path := strings.Replace(r.path, "%s", url.PathEscape(arg), 1)
		before := snapshot(t)
		a := fuzzhttp.Do(t, http.MethodPost, base+path, r.token, body)
		if a.OK() {
			return
		}
		after := snapshot(t)
		want := before
		if a.Code == problem.FencedOut || a.Code == problem.SubmissionExists {
			// Evidence only: FENCED rows and safety events.
			want.fencedRows, want.safetyEvents = after.fencedRows, after.safetyEvents
		}
		if after != want {
			t.Fatalf("POST %s with body %q was refused (%d %s) but changed state: %+v -> %+v (allowed: %+v)", path, body, a.Status, a.Code, before, after, want)
		}
	})
}
