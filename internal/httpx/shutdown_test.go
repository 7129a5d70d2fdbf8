package httpx_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
)

// logLines collects a JSON logger's lines (one per Write) and tells
// whoever waits for a message when it is written.
type logLines struct {
	mu      sync.Mutex
	lines   []map[string]any
	waitFor string
	seen    chan struct{}
}

func (l *logLines) Write(p []byte) (int, error) {
	var m map[string]any
	if err := json.Unmarshal(p, &m); err != nil {
		return 0, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, m)
	if m["msg"] == l.waitFor {
		close(l.seen)
		l.waitFor = ""
	}
	return len(p), nil
}

func (l *logLines) all() []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]map[string]any(nil), l.lines...)
}

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
			capture := &logLines{waitFor: "shutting down", seen: make(chan struct{})}
			log := slog.New(slog.NewJSONHandler(capture, &slog.HandlerOptions{Level: slog.LevelDebug}))
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
			<-capture.seen
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
			var last map[string]any
			for _, r := range capture.all() {
				if r["msg"] != "request" {
					last = r
				}
			}
			switch {
			case tc.drain:
				if err != nil || last["level"] != "INFO" || last["msg"] != "stopped" || last["took"] == nil {
					t.Fatalf("drained: Serve %v, last line %v; want nil and INFO stopped with how long it took", err, last)
				}
			default:
				if err == nil || last["level"] != "WARN" || last["open_requests"] != float64(1) || last["grace"] != tc.grace.String() {
					t.Fatalf("grace ran out: Serve %v, last line %v; want an error and a WARN line with 1 open request", err, last)
				}
			}
		})
	}
}
