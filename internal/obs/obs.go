// Package obs holds the process-wide observability pieces: a JSON slog
// logger with the project's keys, a Prometheus registry per process and the
// build information every role reports.
package obs

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Log keys used everywhere, so one query finds one thing across roles.
const (
	KeyRole      = "role"
	KeyRequestID = "request_id"
	KeyKey       = "key"
	KeyToken     = "token"
	KeyHolder    = "holder"
	KeyPayoutID  = "payout_id"
	KeyAccountID = "account_id"
	KeyEvent     = "event"
	KeyError     = "error"
)

// ParseLevel maps debug|info|warn|error (any case; warning for warn) to a
// level; anything else is an error naming what it takes.
func ParseLevel(s string) (slog.Level, error) {
	switch strings.ToLower(s) {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("must be one of debug, info, warn, error, got %q", s)
}

// NewLogger returns a JSON logger writing to w (stderr when nil), tagged
// with the role.
func NewLogger(w io.Writer, level slog.Level, role string) *slog.Logger {
	if w == nil {
		w = os.Stderr
	}
	h := slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})
	l := slog.New(h)
	if role != "" {
		l = l.With(KeyRole, role)
	}
	return l
}

// NewRegistry returns a fresh registry with the Go and process collectors
// and the payouts_build_info gauge.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		newBuildInfoGauge(Build()))
	return r
}

// LevelOf is the least severe level l writes (its handler's level).
func LevelOf(l *slog.Logger) slog.Level {
	ctx := context.Background()
	for _, lv := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn} {
		if l.Enabled(ctx, lv) {
			return lv
		}
	}
	return slog.LevelError
}
