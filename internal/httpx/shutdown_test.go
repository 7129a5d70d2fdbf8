package httpx_test

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/payouts/payouts/dev/logtest"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
)

// TestShutdownSaysHowItEnded: the last line of a server's shutdown says
// whether it drained ("stopped", with how long it took) or its grace ran
// out with requests still open (WARN, with how many); the log ended at
// "shutting down" either way.
func TestShutdownSaysHowItEnded(t *testing.T) {
	for _, tc := range []struct {
		name  string
		grace time.Duration
		drain bool // the open request finishes within the grace
	}{
		{"drained", time.Minute, true},
		{"grace ran out", 100 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			capture, log := logtest.New()
			s := httpx.NewServer(httpx.Config{Role: "test", Addr: "127.0.0.1:0", Auth: auth.Insecure(), Logger: log, ShutdownTimeout: tc.grace})
			addr, err := s.Listen()
			if err != nil {
				t.Fatal(err)
			}
			entered, release := make(chan struct{}), make(chan struct{})
			s.Router().Get("/v1/slow", func(w http.ResponseWriter, r *http.Request) {
				close(entered)
				<-release
				w.WriteHeader(http.StatusOK)
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			served := make(chan error, 1)
			go func() { served <- s.Serve(ctx) }()
			answered := make(chan struct{})
			go func() {
				defer close(answered)
				if resp, err := http.Get("http://" + addr.String() + "/v1/slow"); err == nil {
					resp.Body.Close()
				}
			}()
			<-entered
			cancel()
			capture.WaitFor(t, time.Minute, "shutting down", func(rs []logtest.Record) bool {
				for _, r := range rs {
					if r.Message == "shutting down" {
						return true
					}
				}
				return false
			})
			if tc.drain {
				close(release)
			}
			err = <-served
			if !tc.drain {
				close(release)
			}
			<-answered
			// The last line but the open request's own (logged when it
			// ends, after the grace in the second case).
			var last logtest.Record
			for _, r := range capture.Records() {
				if r.Message != "request" {
					last = r
				}
			}
			switch {
			case tc.drain:
				if err != nil || last.Level != slog.LevelInfo || last.Message != "stopped" || last.Attrs["took"] == nil {
					t.Fatalf("drained: Serve %v, last line %v; want nil and INFO stopped with how long it took", err, last)
				}
			default:
				if err == nil || last.Level != slog.LevelWarn || last.Attrs["open_requests"] != int64(1) || last.Attrs["grace"] != tc.grace.String() {
					t.Fatalf("grace ran out: Serve %v, last line %v; want an error and a WARN line with 1 open request", err, last)
				}
			}
		})
	}
}
