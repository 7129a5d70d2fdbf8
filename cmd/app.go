package cmd

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"

	"github.com/payouts/payouts/internal/obs"
)

// app is what every command of one process shares, built in one place
// (this file): the logger settings, the process's one metrics registry
// (with the payouts_build_info gauge) and the handling of signals.
// Commands never exit the process: they return, and Execute exits (only
// a second interrupt ends it at once).
type app struct {
	logLevel string
	registry *prometheus.Registry
}

func newApp() *app { return &app{registry: obs.NewRegistry()} }

// logger is the process's JSON logger on the command's stderr, tagged with
// the role.
// It also becomes slog's default, so a library that falls back to
// slog.Default() (a client built without its logger option) still writes
// the same JSON lines with the role, not plain text beside them.
func (a *app) logger(cmd *cobra.Command, role string) *slog.Logger {
	level, _ := obs.ParseLevel(a.logLevel) // checked before any command runs (prepare); info if not
	l := obs.NewLogger(cmd.ErrOrStderr(), level, role)
	slog.SetDefault(l)
	return l
}

// interruptContext is the context of the whole command: the first SIGINT
// or SIGTERM cancels it (servers drain, the executor finishes its steps and
// releases its locks, then the command returns); a second one ends the
// process at once with exit 1 — the only place a process exits other than
// by returning from Execute.
func interruptContext() (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	log := obs.NewLogger(os.Stderr, slog.LevelInfo, "")
	go func() {
		select {
		case sig := <-sigs:
			log.Info("stop requested: finishing current work and releasing what is held (signal again to exit at once)", "signal", sig.String())
			cancel()
		case <-ctx.Done():
			return
		}
		sig := <-sigs
		log.Warn("second signal: exiting at once; held locks expire with their session TTL", "signal", sig.String())
		os.Exit(1)
	}()
	return ctx, func() {
		signal.Stop(sigs)
		cancel()
	}
}

// reloadOn calls every reload on each SIGHUP (hup) until ctx ends: a
// server re-reads its auth file and its TLS certificate and key. A failed
// reload is logged and keeps what is in force.
func reloadOn(ctx context.Context, hup <-chan os.Signal, log *slog.Logger, reloads map[string]func() error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-hup:
		}
		for what, reload := range reloads {
			if err := reload(); err != nil {
				log.Error("reload failed; the previous settings stay in force", "what", what, obs.KeyError, err.Error())
				continue
			}
			log.Info("reloaded", "what", what)
		}
	}
}
