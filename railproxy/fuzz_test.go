package railproxy

import (
	"context"
	"io"
	"log/slog"
	"net/http"
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

// FuzzSubmit sends malformed and valid bodies to POST /v1/submissions of a
// proxy in front of a rail stub. Every answer is a 2xx or a 4xx problem;
// a refused submission forwards nothing and moves no high-water mark.
func FuzzSubmit(f *testing.F) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	f.Cleanup(cancel)
	dbURL := pgtest.NewDB(f, migrations.ProxyDB)
	log := obs.NewLogger(io.Discard, slog.LevelInfo, "fuzz")
	rs, err := rail.New(rail.Config{Addr: "127.0.0.1:0", Logger: log, Auth: testAuth(), SettlementWindow: time.Minute})
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
	url := "http://" + paddr.String() + "/v1/submissions"

	// A forwarded submission at token 5, for duplicates and stale tokens.
	fixture := `{"payout_id":"fz-done","account_id":"fz-acc","token":5,"holder":"h-5","client_ref":"po-fz-done","amount":100,"currency":"EUR","beneficiary_ref":"b"}`
	if a := fuzzhttp.Do(f, http.MethodPost, url, executorBearer, []byte(fixture)); !a.OK() {
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

	for _, s := range []string{
		fixture,
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
		a := fuzzhttp.Do(t, http.MethodPost, url, executorBearer, body)
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
