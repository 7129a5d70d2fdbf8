package reconcile

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/lockclient"
	"github.com/payouts/payouts/payment/paymentclient"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Role is the role the reconciler's token must have.
const Role = "reconciler"

// Exit codes of `payouts reconcile` (DESIGN §4b).
const (
	ExitClean     = 0
	ExitFindings  = 1
	ExitCannotRun = 2
)

// Config is `payouts reconcile`.
type Config struct {
	LockURL, PaymentURL, ProxyURL, RailURL string
	// Token is the bearer sent to the lock service, the payment resource
	// and the rail proxy (the reconciler role); never to the rail.
	Token string
	// RailToken is the rail credential, given explicitly: the bearer of
	// every lookup by client reference at the rail (and of the settlement
	// report when RailReportToken is empty). Required.
	RailToken string
	// RailReportToken, when set, is sent to the rail for its settlement
	// report (an operator's right there).
	RailReportToken string
	// HTTPClient carries every call (httpx.NewHTTPClient: TLS settings);
	// nil: the default client.
	HTTPClient *http.Client
	// Once runs one pass and returns its exit code.
	Once bool
	// Interval is the pause between passes in continuous mode.
	Interval time.Duration
	// Listen is the address of /metrics and /healthz in continuous mode.
	Listen string
	// JSON prints reports as JSON instead of a table.
	JSON bool
	// MetricsFile, when set, receives the metrics after every pass
	// (Prometheus text format, written atomically).
	MetricsFile string
	// RequestTimeout bounds each call to a service.
	RequestTimeout time.Duration
	// StateFile, when set, remembers which safety events were already
	// reported, so each is reported by one pass only (see State).
	StateFile string
	Options
	// Out receives the reports (stdout).
	Out      io.Writer
	Logger   *slog.Logger
	Registry *prometheus.Registry
}

// Run runs the reconciler. With Once it makes one pass, prints the
// report and returns ExitClean, ExitFindings or ExitCannotRun. Otherwise it
// serves /metrics and /healthz on Listen and makes a pass every Interval
// until ctx ends, then returns ExitClean (or ExitCannotRun when it could
// not start).
func Run(ctx context.Context, cfg Config) (code int, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// A --once run that cannot start a pass (a refused token, an
	// unreadable state file) still says so in the metrics file: the
	// previous run's up=1 must not stand for this one.
	passed := false
	if cfg.Once {
		defer func() {
			if !passed && code == ExitCannotRun {
				failMetricsFile(cfg, err)
			}
		}()
	}
	cfg.Options.Logger = cfg.Logger
	// A file the run could not write at its end fails it before its pass:
	// a whole pass was made, and only then exit 2.
	for _, f := range []struct{ flag, path string }{{"--state-file", cfg.StateFile}, {"--metrics-file", cfg.MetricsFile}} {
		if err := checkDir(f.flag, f.path); err != nil {
			return ExitCannotRun, fmt.Errorf("%w: %w", ErrCannotRun, err)
		}
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	opts := []httpx.ClientOption{httpx.WithTimeout(cfg.RequestTimeout), httpx.WithHTTPClient(cfg.HTTPClient)}
	payment, err := paymentclient.New(cfg.PaymentURL, cfg.Token, opts...)
	if err != nil {
		return ExitCannotRun, fmt.Errorf("--payment-url: %w", err)
	}
	proxy, err := proxyclient.New(cfg.ProxyURL, cfg.Token, opts...)
	if err != nil {
		return ExitCannotRun, fmt.Errorf("--proxy-url: %w", err)
	}
	rail, railReport, err := railClients(cfg, opts)
	if err != nil {
		return ExitCannotRun, err
	}
	if cfg.Options.SessionTTL <= 0 {
		cfg.Options.SessionTTL = DefaultSessionTTL
	}
	lock, err := NewLockService(cfg.LockURL, cfg.Token, cfg.Options.Owner, cfg.Options.SessionTTL, cfg.RequestTimeout, lockclient.WithHTTPClient(cfg.HTTPClient), lockclient.WithLogger(cfg.Logger))
	if err != nil {
		return ExitCannotRun, fmt.Errorf("--lock-url: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = lock.Close(cctx)
	}()
	if cfg.StateFile != "" {
		st, err := LoadState(cfg.StateFile)
		if err != nil {
			return ExitCannotRun, err
		}
		cfg.Options.SafetyEventsAfter = st.SafetyEventsAfter
	}
	rec, err := New(Clients{Lock: lock, Payment: payment, Proxy: proxy, Rail: rail, RailReport: railReport}, cfg.Options)
	if err != nil {
		return ExitCannotRun, err
	}
	if err := rec.refusal(ctx, cfg, nil); err != nil {
		return ExitCannotRun, err
	}
	if cfg.Once {
		passed = true
		return rec.once(ctx, cfg)
	}
	return rec.continuous(ctx, cfg)
}

// checkDir refuses a file path (of flag) whose directory does not exist or
// is no directory: the file is written there by atomic rename. "" is no
// file.
func checkDir(flag, path string) error {
	if path == "" {
		return nil
	}
	dir := filepath.Dir(path)
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Errorf("%s %s: its directory %s does not exist", flag, path, dir)
	case err != nil:
		return fmt.Errorf("%s %s: %w", flag, path, err)
	case !fi.IsDir():
		return fmt.Errorf("%s %s: %s is not a directory", flag, path, dir)
	}
	return nil
}

// failMetricsFile records in --metrics-file a run that could not start
// its pass (up 0, a failed pass; the rest carried over).
func failMetricsFile(cfg Config, err error) {
	if werr := openMetricsFile(cfg.Logger, cfg.MetricsFile).write(nil, err, 0, time.Now()); werr != nil {
		cfg.Logger.Error("could not record the failed run in the metrics file", obs.KeyError, werr.Error())
	}
}

// railClients are the clients of the rail: lookups go with the rail
// credential, the settlement report with the report credential when one is
// given, else with the rail credential too. The reconciler's own token is
// never sent to the rail (it is another trust domain's credential).
func railClients(cfg Config, opts []httpx.ClientOption) (lookup, report *railclient.Client, err error) {
	if cfg.RailToken == "" {
		return nil, nil, fmt.Errorf("%w: no rail credential: give --rail-token-file (or %s), the bearer the rail accepts for lookups by client reference (a token of role reconciler in the rail's auth file); the reconciler never sends its own token to the rail",
			ErrCannotRun, "PAYOUTS_RAIL_TOKEN_FILE")
	}
	if lookup, err = railclient.New(cfg.RailURL, cfg.RailToken, opts...); err != nil {
		return nil, nil, fmt.Errorf("--rail-url: %w", err)
	}
	report = lookup
	if cfg.RailReportToken != "" {
		if report, err = railclient.New(cfg.RailURL, cfg.RailReportToken, opts...); err != nil {
			return nil, nil, fmt.Errorf("--rail-url: %w", err)
		}
	}
	return lookup, report, nil
}

// refusedToken reports a 401 or 403 answer: asking again will not help.
var refusedToken = problem.RefusedToken

// refusal names the service that refuses the reconciler's token, asking
// each one a cheap question; nil when none does. The guards are also asked
// which role they know the token as: the reconciler writes there
// (resolutions at the payment resource, lookups at the proxy), which only
// a reconciler's or an operator's token may, and a token of another role
// that every read accepts would otherwise run whole passes and be refused
// only on its first ambiguous payout. passErr is the error of a pass that
// failed on a refused token: when no other service refuses, it was the
// rail.
func (r *Reconciler) refusal(ctx context.Context, cfg Config, passErr error) error {
	type whoami func(context.Context) (auth.Identity, error)
	probes := []struct {
		service, url string
		ask          func(context.Context) error
		who          whoami
	}{
		{"lock service", cfg.LockURL, func(ctx context.Context) error { _, err := r.c.Lock.HighToken(ctx); return err }, nil},
		{"payment resource", cfg.PaymentURL, func(ctx context.Context) error { _, err := r.c.Payment.HighFence(ctx); return err }, r.c.Payment.WhoAmI},
		{"rail proxy", cfg.ProxyURL, func(ctx context.Context) error { _, err := r.c.Proxy.HighFence(ctx); return err }, r.c.Proxy.WhoAmI},
	}
	for _, p := range probes {
		err := p.ask(ctx)
		if err == nil && p.who != nil {
			// A role that may not write there (the reconciler's and an
			// operator's may); a service that cannot say: its first
			// refused write stops the reconciler then.
			err, _ = httpx.RoleRefusal(ctx, p.who, func(id auth.Identity) bool {
				return id.Allows(auth.Reconciler) || id.Role == auth.Operator
			}, "resolve or look up ambiguous payouts")
		}
		if refusedToken(err) {
			return fmt.Errorf("%w: the %s at %s refused the token (%w): the reconciler needs a bearer token of role %q there (--token or --token-file)",
				ErrCannotRun, p.service, p.url, err, Role)
		}
	}
	if refusedToken(passErr) {
		return fmt.Errorf("%w: the rail at %s refused a rail credential (%w): lookups by client reference need a reconciler-role token of the rail (--rail-token-file), its settlement report an operator's (--rail-report-token-file)",
			ErrCannotRun, cfg.RailURL, passErr)
	}
	return nil
}

func (r *Reconciler) timedPass(ctx context.Context) (*Report, time.Duration, time.Time, error) {
	start := time.Now()
	rep, err := r.Pass(ctx)
	end := time.Now()
	return rep, end.Sub(start), end, err
}

func (r *Reconciler) print(cfg Config, rep *Report) error {
	if cfg.Out == nil {
		return nil
	}
	if cfg.JSON {
		return rep.WriteJSON(cfg.Out)
	}
	return rep.WriteTable(cfg.Out)
}

// openMetricsFile prepares --metrics-file (path); a previous file it
// cannot read is logged and replaced (the detective controls must still
// run).
func openMetricsFile(log *slog.Logger, path string) *fileMetrics {
	fm, err := newFileMetrics(path)
	if err != nil {
		log.Warn("could not carry the previous metrics file over", obs.KeyError, err.Error())
	}
	return fm
}

func (r *Reconciler) once(ctx context.Context, cfg Config) (int, error) {
	fm := openMetricsFile(r.log, cfg.MetricsFile)
	rep, took, end, err := r.timedPass(ctx)
	if refusedToken(err) {
		if rerr := r.refusal(ctx, cfg, err); rerr != nil {
			err = rerr
		}
	}
	r.logFindings(rep, err)
	code, commit, err := r.finish(cfg, rep, err)
	// The metrics file is written after everything that decides the exit
	// code, so that it says what the code says (a report that could not be
	// printed, a state that could not be written: a failed run there
	// too), and before the state file moves on: the safety events this
	// pass reported are then in the metrics file (the alerts read them
	// there) before a later run stops reporting them. A run that cannot
	// write its metrics file leaves the state as it was, and the next run
	// reports the same events again.
	if werr := fm.write(rep, err, took, end); werr != nil {
		_ = commit(false)
		if code != ExitCannotRun {
			return ExitCannotRun, cannotRun("write the metrics file", werr)
		}
		r.log.Error("could not write the metrics file", obs.KeyError, werr.Error())
		return code, err
	}
	if cerr := commit(true); cerr != nil {
		// Only the rename of a file already written beside it failed:
		// the metrics file says the pass completed; the log and the exit
		// code say the state did not move on.
		r.log.Error("could not save the state file after the metrics file was written; the next run reports this pass's safety events again", obs.KeyError, cerr.Error())
		return ExitCannotRun, cannotRun("save the state file", cerr)
	}
	return code, err
}

// finish prints a --once pass's report, prepares its state and returns its
// exit code; commit(true) then saves the state, commit(false) drops it.
func (r *Reconciler) finish(cfg Config, rep *Report, err error) (int, func(keep bool) error, error) {
	none := func(bool) error { return nil }
	if !rep.Complete() {
		return ExitCannotRun, none, err
	}
	// Every check ran: the report is printed, and the safety events it
	// reported are not reported again, also when some ambiguous payouts
	// could not be resolved (still exit 2).
	if perr := r.print(cfg, rep); perr != nil {
		return ExitCannotRun, none, perr
	}
	commit := none
	if cfg.StateFile != "" {
		c, serr := prepareState(cfg.StateFile, State{SafetyEventsAfter: rep.SafetyEventsSeen})
		if serr != nil {
			return ExitCannotRun, none, cannotRun("save the state file", serr)
		}
		commit = c
	}
	r.opts.SafetyEventsAfter = rep.SafetyEventsSeen
	switch {
	case err != nil:
		return ExitCannotRun, commit, err
	case !rep.Clean():
		return ExitFindings, commit, nil
	}
	return ExitClean, commit, nil
}

func (r *Reconciler) continuous(ctx context.Context, cfg Config) (int, error) {
	if cfg.Interval <= 0 {
		return ExitCannotRun, errors.New("--interval must be positive in continuous mode (or use --once)")
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	metrics := NewMetrics(cfg.Registry)
	fm := openMetricsFile(r.log, cfg.MetricsFile)
	srv := httpx.NewServer(httpx.Config{Role: "reconcile", Addr: cfg.Listen, Logger: cfg.Logger, Registry: cfg.Registry})
	addr, err := srv.Listen()
	if err != nil {
		return ExitCannotRun, fmt.Errorf("listen on %s: %w", cfg.Listen, err)
	}
	r.log.Info("reconciler running", "listen", addr.String(), "interval", cfg.Interval.String())
	var g httpx.Group
	g.Add(srv.Serve)
	g.Add(func(ctx context.Context) error {
		t := time.NewTimer(0)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			}
			rep, took, end, err := r.timedPass(ctx)
			if ctx.Err() != nil {
				return nil
			}
			metrics.Observe(rep, err, took, end)
			werr := fm.write(rep, err, took, end)
			if werr != nil {
				r.log.Error("could not write the metrics file: this pass's safety events are reported again by the next", obs.KeyError, werr.Error())
			}
			r.logFindings(rep, err)
			if refusedToken(err) {
				// A revoked or rotated token: no later pass can succeed.
				if rerr := r.refusal(ctx, cfg, err); rerr != nil {
					return rerr
				}
				return err
			}
			if rep.Complete() {
				if cfg.JSON {
					_ = r.print(cfg, rep)
				}
				// As --once: the state moves on only once the metrics
				// file carries the safety events it will no longer report.
				if werr == nil {
					if err := r.saveState(cfg, rep); err != nil {
						r.log.Error("could not write the state file", obs.KeyError, err.Error())
					}
				}
			}
			t.Reset(cfg.Interval)
		}
	})
	if err := g.Run(ctx); err != nil {
		return ExitCannotRun, err
	}
	return ExitClean, nil
}

// saveState records how far the safety-event logs were reported, after the
// report is out; the next pass starts after it. This process's next pass
// does so with or without a state file; the next cron run, or this
// reconciler restarted, only with one. A state file that cannot be written
// keeps the cursor where it was, so the events are reported again rather
// than lost.
func (r *Reconciler) saveState(cfg Config, rep *Report) error {
	if cfg.StateFile != "" {
		if err := SaveState(cfg.StateFile, State{SafetyEventsAfter: rep.SafetyEventsSeen}); err != nil {
			return cannotRun("save the state file", err)
		}
	}
	r.opts.SafetyEventsAfter = rep.SafetyEventsSeen
	return nil
}

// logFindings logs a pass's summary and each listed finding, at the level
// its kind deserves (duplicate payments and attempts: ERROR). A pass that
// could not run (err) is logged at ERROR with what it found before it
// stopped: evidence of a duplicate payment is not lost with the pass.
func (r *Reconciler) logFindings(rep *Report, err error) {
	if rep == nil {
		rep = newReport(0)
	}
	for _, f := range rep.Findings {
		level := slog.LevelWarn
		switch f.Check {
		case CheckDuplicateAttempt, CheckSettledPerClientRef, CheckForwardedSubmissions, CheckRailWithoutSubmission,
			CheckSettledNotPosted, CheckLockRewound, CheckLedgerGroupSum, CheckBalanceDrift:
			level = slog.LevelError
		}
		r.log.Log(context.Background(), level, "reconcile finding", obs.KeyEvent, f.Check, "invariant", f.Invariant, "objects", f.Objects, "evidence", f.Evidence)
	}
	total := 0
	for _, n := range rep.Counts {
		total += n
	}
	attrs := []any{"findings", total, "resolved", len(rep.Resolved), "unresolved", len(rep.Unresolved),
		"highest_fence", int64(rep.HighestFence), "lock_high_token", int64(rep.LockHighToken), "payouts", rep.Scanned.Payouts}
	switch {
	case err != nil && rep.Complete():
		r.log.Error("reconciliation pass checked everything, but part of it failed (ambiguous payouts it could not look at, or its output)",
			append(attrs, obs.KeyError, err.Error())...)
	case err != nil:
		r.log.Error("reconciliation pass could not run; the findings above are what it found before it stopped, and a clean part proves nothing",
			append(attrs, obs.KeyError, err.Error())...)
	default:
		r.log.Info("reconciliation pass done", attrs...)
	}
}
