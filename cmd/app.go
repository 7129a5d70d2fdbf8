package cmd

import (
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/obs"
)

// app is what every command of one process shares, built in one place:
// the logger settings and the process's one metrics registry (with the
// payouts_build_info gauge). Signals are turned into the cancellation of
// the command's context by Execute; commands never exit the process.
type app struct {
	logLevel string
	registry *prometheus.Registry
}

func newApp() *app { return &app{registry: obs.NewRegistry()} }

// logger is the process's JSON logger on the command's stderr, tagged with
// the role.
func (a *app) logger(cmd *cobra.Command, role string) *slog.Logger {
	return obs.NewLogger(cmd.ErrOrStderr(), obs.ParseLevel(a.logLevel), role)
}
