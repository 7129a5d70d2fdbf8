// Package railproxy is the rail proxy (`payouts serve proxy`): the second,
// independent fencing guard, and the only one that would remain if the
// payment resource could not be modified (domain model 2.6 step 7).
//
// A submission is accepted in one transaction whose first statement
// advances the account's high-water mark conditionally (DESIGN D-1) and
// whose second writes the intent row (FR-19) under a partial unique index
// that allows one forwarded submission per payout, ever (D-5, INV-02). Only
// after that commit is the rail called, once, with the payout's stable
// client reference; the outcome is recorded once and never retried. A
// timeout, a connection failure, a 5xx or an answer that cannot be read is
// TIMEOUT: money may have moved, and only a lookup can tell (D-6).
package railproxy

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/rail/railclient"
	"github.com/payouts/payouts/railproxy/proxyclient"
)

// Config configures the proxy.
type Config struct {
	Addr        string
	Logger      *slog.Logger
	Registry    *prometheus.Registry
	Auth        *auth.Authenticator
	TLS         *tls.Config // serve HTTPS (nil: plain HTTP)
	DatabaseURL string      // proxydb, migrated
	RailURL     string
	RailToken   string // bearer sent to the rail
	// HTTPClient carries the rail calls (httpx.NewHTTPClient: TLS settings);
	// nil: the default client.
	HTTPClient *http.Client
	// RailTimeout bounds the one rail call of a submission; past it the
	// outcome is TIMEOUT. Default 10s.
	RailTimeout time.Duration
	// RequestTimeout is the per-request deadline of the HTTP API (default
	// 30s). A submission whose rail call outlives it is still finished and
	// recorded.
	RequestTimeout time.Duration

	// crashPoint makes the process exit at that point (tests only; set by
	// this package's tests or, with -tags crashpoints, from the environment).
	crashPoint string
}

// Crash points (test builds only): see crashpoint_on.go.
const (
	CrashAfterIntent     = "after_intent"
	CrashAfterRailAnswer = "after_rail_answer"
)

// Server is the rail proxy.
type Server struct {
	cfg  Config
	log  *slog.Logger
	st   *store
	pool *pgxpool.Pool
	rail *railclient.Client
	http *httpx.Server
	m    *metrics

	forwards sync.WaitGroup // detached rail calls still running
	inflight sync.Map       // payout id -> struct{} while its rail call runs
}

// New connects to proxydb and builds the proxy. Close releases the pool.
func New(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	if cfg.RailTimeout == 0 {
		cfg.RailTimeout = 10 * time.Second
	}
	if cfg.RailTimeout < 0 {
		return nil, fmt.Errorf("railproxy: rail timeout %s is negative", cfg.RailTimeout)
	}
	if cfg.crashPoint == "" {
		cfg.crashPoint = crashPointFromEnv()
	}
	switch cfg.crashPoint {
	case "", CrashAfterIntent, CrashAfterRailAnswer:
	default:
		return nil, fmt.Errorf("railproxy: unknown crash point %q (want %s or %s)", cfg.crashPoint, CrashAfterIntent, CrashAfterRailAnswer)
	}
	if cfg.RailURL == "" {
		return nil, errors.New("railproxy: the rail URL is required (--rail-url)")
	}
	rail, err := railclient.New(cfg.RailURL, cfg.RailToken, httpx.WithTimeout(cfg.RailTimeout), httpx.WithHTTPClient(cfg.HTTPClient))
	if err != nil {
		return nil, fmt.Errorf("railproxy: rail: %w", err)
	}
	pcfg, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("railproxy: database URL: %w", err)
	}
	if !strings.Contains(cfg.DatabaseURL, "pool_max_conns") {
		pcfg.MaxConns = 16
	}
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("railproxy: connect to proxydb: %w", err)
	}
	s := &Server{cfg: cfg, log: cfg.Logger, pool: pool, st: &store{pool: pool}, rail: rail, m: newMetrics(cfg.Registry)}
	cfg.Registry.MustRegister(newUnresolvedCollector(s.st, cfg.RailTimeout, cfg.Logger))
	s.http = httpx.NewServer(httpx.Config{
		Role: "proxy", Addr: cfg.Addr, Logger: cfg.Logger, Registry: cfg.Registry, Auth: cfg.Auth,
		RequestTimeout: cfg.RequestTimeout,
		Ready:          []httpx.Check{func(ctx context.Context) error { return pool.Ping(ctx) }},
		TLS:            cfg.TLS,
	})
	s.routes(s.http.Router())
	if !guardEnabled {
		s.log.Error("NEGATIVE CONTROL BUILD: the proxy's fence condition is compiled out; stale tokens are accepted. Never run this in production.")
	}
	if cfg.crashPoint != "" {
		s.log.Warn("crash point armed: the proxy will exit with status 3", "crash_point", cfg.crashPoint)
	}
	return s, nil
}

// Run serves the proxy until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	defer s.Close()
	if _, err := s.Listen(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen binds the listen address.
func (s *Server) Listen() (net.Addr, error) { return s.http.Listen() }

// Serve serves until ctx is done, then drains requests and waits for every
// detached rail call to finish and be recorded.
func (s *Server) Serve(ctx context.Context) error {
	err := s.http.Serve(ctx)
	s.forwards.Wait()
	return err
}

// Handler is the full HTTP handler.
func (s *Server) Handler() http.Handler { return s.http.Handler() }

// Close waits for detached rail calls and closes the database pool.
func (s *Server) Close() {
	s.forwards.Wait()
	s.pool.Close()
}

func (s *Server) routes(r chi.Router) {
	r.Route("/v1", func(r chi.Router) {
		r.Post("/submissions", httpx.Handler(s.submit))
		r.Get("/submissions", idPaged(s.st.list))
		r.Get("/submissions/{payout_id}", httpx.Handler(s.get))
		r.Post("/submissions/{payout_id}/lookup", httpx.Handler(s.lookup))
		r.Get("/safety-events", idPaged(s.st.safetyEvents))
		r.Get("/fences/high", httpx.Handler(s.highFence))
		r.Get("/high-water", httpx.Handler(s.highWater))
	})
}

var currencyRE = regexp.MustCompile(`^[A-Z]{3}$`)

const (
	maxAmount = 1_000_000_000_000_000 // exclusive (DESIGN D-14)
	maxIDLen  = 200
)

func validateSubmit(r proxyclient.SubmitRequest) error {
	text := []struct{ name, v string }{
		{"payout_id", r.PayoutID}, {"account_id", r.AccountID}, {"holder", string(r.Holder)},
		{"client_ref", r.ClientRef}, {"beneficiary_ref", r.BeneficiaryRef},
	}
	for _, f := range text {
		if strings.TrimSpace(f.v) == "" {
			return problem.New(problem.InvalidRequest, "%s is required", f.name)
		}
		if len(f.v) > maxIDLen {
			return problem.New(problem.InvalidRequest, "%s is longer than %d characters", f.name, maxIDLen)
		}
		if strings.ContainsRune(f.v, 0) {
			return problem.New(problem.InvalidRequest, "%s must not contain NUL characters", f.name)
		}
	}
	if !r.Token.Valid() {
		return problem.New(problem.InvalidRequest, "token is required and must be a positive integer below 2^53, got %d", int64(r.Token))
	}
	if r.Amount <= 0 || r.Amount >= maxAmount {
		return problem.New(problem.InvalidRequest, "amount must be a positive integer in minor units below 10^15, got %d", r.Amount)
	}
	if !currencyRE.MatchString(r.Currency) {
		return problem.New(problem.InvalidRequest, "currency must be a three-letter upper-case ISO 4217 code, got %q", r.Currency)
	}
	return nil
}

// dbTimeout bounds each detached database step of a submission.
const dbTimeout = 15 * time.Second

func (s *Server) submit(w http.ResponseWriter, r *http.Request) error {
	var req proxyclient.SubmitRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := validateSubmit(req); err != nil {
		return err
	}
	log := httpx.Log(r.Context()).With(obs.KeyPayoutID, req.PayoutID, obs.KeyAccountID, req.AccountID,
		obs.KeyKey, fencing.Key(req.AccountID), obs.KeyToken, int64(req.Token), obs.KeyHolder, string(req.Holder))

	// From here on the caller going away changes nothing: an interrupted
	// commit would leave us not knowing whether the intent was written.
	detached := context.WithoutCancel(r.Context())
	ctx, cancel := context.WithTimeout(detached, dbTimeout)
	rec, res, err := s.st.writeIntent(ctx, req)
	cancel()
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "the submission could not be recorded; it was not forwarded")
	}
	switch res {
	case intentFenced:
		return s.fencedOut(detached, log, req)
	case intentExists:
		return s.duplicate(detached, log, req)
	}

	log.Info("submission intent recorded", "submission_id", rec.ID, "client_ref", rec.ClientRef)
	s.crash(log, CrashAfterIntent)

	done := make(chan forwardResult, 1)
	s.forwards.Add(1)
	s.inflight.Store(rec.PayoutID, struct{}{})
	go func() {
		defer s.forwards.Done()
		defer s.inflight.Delete(rec.PayoutID)
		done <- s.forward(detached, log, rec)
	}()
	select {
	case fr := <-done:
		if fr.err != nil {
			return problem.Wrap(problem.Unavailable, fr.err,
				"the submission was forwarded to the rail but its outcome could not be recorded; treat it as ambiguous")
		}
		httpx.WriteJSON(w, http.StatusOK, fr.rec)
		return nil
	case <-r.Context().Done():
		return problem.New(problem.Unavailable,
			"the rail has not answered yet; the proxy will record the outcome of payout %s (GET /v1/submissions/%s)", rec.PayoutID, rec.PayoutID)
	}
}

func (s *Server) fencedOut(ctx context.Context, log *slog.Logger, req proxyclient.SubmitRequest) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	key := fencing.Key(req.AccountID)
	ev, err := s.st.recordFenced(ctx, req, fmt.Sprintf("submission of payout %s refused at the proxy: token %d is not above the account's high-water mark", req.PayoutID, req.Token))
	s.m.fencedOut.Inc()
	s.m.submissions.WithLabelValues(string(proxyclient.OutcomeFenced)).Inc()
	s.m.safetyEvents.WithLabelValues(proxyclient.KindFencedOut).Inc()
	attrs := []any{obs.KeyEvent, proxyclient.KindFencedOut, "stored_token", int64(ev.StoredToken), "stored_holder", string(ev.StoredHolder)}
	if err != nil {
		// The refusal stands; only its evidence row is missing. Say so loudly.
		log.Error("fenced_out: submission refused, but its evidence could not be recorded", append(attrs, obs.KeyError, err.Error())...)
	} else {
		log.Warn("fenced_out: stale token refused at the proxy; nothing forwarded", append(attrs, "submission_id", ev.Record.ID)...)
	}
	if ev.Regression {
		s.m.safetyEvents.WithLabelValues(proxyclient.KindTokenRegression).Inc()
		log.Warn("token_regression: the same token was presented by a different holder; a token was re-issued (INV-04)",
			obs.KeyEvent, proxyclient.KindTokenRegression, "stored_holder", string(ev.StoredHolder))
	}
	return problem.Fenced(key, int64(req.Token), int64(ev.StoredToken),
		"token %d is stale at the rail proxy for %s (high-water %d); the submission was not forwarded", req.Token, key, ev.StoredToken)
}

func (s *Server) duplicate(ctx context.Context, log *slog.Logger, req proxyclient.SubmitRequest) error {
	ctx, cancel := context.WithTimeout(ctx, dbTimeout)
	defer cancel()
	existing, err := s.st.recordDuplicate(ctx, req)
	s.m.duplicates.Inc()
	s.m.safetyEvents.WithLabelValues(proxyclient.KindDuplicateAttempt).Inc()
	if err != nil {
		log.Error("duplicate_attempt: payout already forwarded; refused, but the evidence could not be recorded",
			obs.KeyEvent, proxyclient.KindDuplicateAttempt, obs.KeyError, err.Error())
		return problem.Wrap(problem.SubmissionExists, err, "payout %s already has a forwarded submission; it was not forwarded again", req.PayoutID)
	}
	log.Error("duplicate_attempt: payout already has a forwarded submission; refused, nothing forwarded",
		obs.KeyEvent, proxyclient.KindDuplicateAttempt, "existing_submission_id", existing.ID,
		"existing_token", int64(existing.FenceToken), "existing_holder", string(existing.Holder), "existing_outcome", outcomeText(existing.Outcome))
	return problem.New(problem.SubmissionExists,
		"payout %s already has a forwarded submission (outcome %s); it was not forwarded again; resolve the payout from the existing record",
		req.PayoutID, outcomeText(existing.Outcome)).With(proxyclient.ExistingExtension, existing)
}

type forwardResult struct {
	rec proxyclient.Record
	err error
}

// forward makes the submission's one rail call and records its outcome.
// It runs detached from the caller and is never retried.
func (s *Server) forward(ctx context.Context, log *slog.Logger, rec proxyclient.Record) forwardResult {
	start := time.Now()
	p, err := s.rail.Pay(ctx, railclient.PaymentRequest{
		ClientRef: rec.ClientRef, Amount: rec.Amount, Currency: rec.Currency, BeneficiaryRef: rec.BeneficiaryRef,
	})
	outcome, railRef, code, why := classify(rec, p, err)
	s.m.railLatency.WithLabelValues(string(outcome)).Observe(time.Since(start).Seconds())
	s.crash(log, CrashAfterRailAnswer)

	// Recording is a local write with no external effect: safe to retry.
	var (
		out  proxyclient.Record
		rerr error
	)
	deadline := time.Now().Add(30 * time.Second)
	for wait := 50 * time.Millisecond; ; wait = min(wait*2, 2*time.Second) {
		wctx, cancel := context.WithTimeout(ctx, dbTimeout)
		out, rerr = s.st.recordOutcome(wctx, rec.ID, outcome, railRef, code)
		cancel()
		if rerr == nil || errors.Is(rerr, pgx.ErrNoRows) || time.Now().After(deadline) {
			break
		}
		log.Warn("could not record the rail's answer; retrying", obs.KeyError, rerr.Error())
		time.Sleep(wait)
	}
	if errors.Is(rerr, pgx.ErrNoRows) {
		// Cannot happen while this is the only writer of outcomes; if it
		// does, the first recorded outcome stands (write-once) and is returned.
		log.Error("the submission's outcome was already recorded by another writer; the first one stands",
			"outcome", string(outcome), "rail_ref", railRef)
		wctx, cancel := context.WithTimeout(ctx, dbTimeout)
		out, rerr = s.st.forwarded(wctx, rec.PayoutID)
		cancel()
		return forwardResult{rec: out, err: rerr}
	}
	if rerr != nil {
		s.m.recordFailure.Inc()
		log.Error("the rail's answer could not be recorded; the submission stays without outcome (ambiguous)",
			"outcome", string(outcome), "rail_ref", railRef, "error_code", code, obs.KeyError, rerr.Error())
		return forwardResult{err: rerr}
	}
	s.m.submissions.WithLabelValues(string(outcome)).Inc()
	lvl := slog.LevelInfo
	if outcome == proxyclient.OutcomeTimeout {
		lvl = slog.LevelWarn
	}
	log.Log(ctx, lvl, "submission outcome recorded", "submission_id", out.ID, "outcome", string(outcome),
		"rail_ref", railRef, "error_code", code, "why", why, "rail_ms", time.Since(start).Milliseconds())
	return forwardResult{rec: out}
}

// classify maps the rail's answer to an outcome. Only a well-formed answer
// about this very payment is ACKED or REJECTED; everything else — no
// answer, a 5xx, any other error status, a body that cannot be read or does
// not match what was sent — is TIMEOUT: money may have moved.
func classify(rec proxyclient.Record, p railclient.Payment, err error) (outcome proxyclient.Outcome, railRef, code, why string) {
	var pe *problem.Error
	switch {
	case err == nil:
	case errors.As(err, &pe):
		return proxyclient.OutcomeTimeout, "", "rail_http_" + strconv.Itoa(pe.Status()),
			fmt.Sprintf("the rail answered HTTP %d (%s): whether it paid is unknown", pe.Status(), pe.Code)
	case errors.Is(err, context.DeadlineExceeded):
		return proxyclient.OutcomeTimeout, "", "rail_timeout", "the rail did not answer in time"
	case errors.Is(err, httpx.ErrTransport):
		return proxyclient.OutcomeTimeout, "", "rail_connection_failed", "no answer from the rail: " + err.Error()
	default:
		return proxyclient.OutcomeTimeout, "", "rail_answer_unparseable", "the rail's answer could not be read: " + err.Error()
	}
	if p.ClientRef != rec.ClientRef || p.Amount != rec.Amount || p.Currency != rec.Currency {
		return proxyclient.OutcomeTimeout, "", "rail_answer_mismatch",
			fmt.Sprintf("the rail answered about another payment (client_ref %q, amount %d %s)", p.ClientRef, p.Amount, p.Currency)
	}
	switch {
	case p.Status == railclient.StatusSettled && p.RailRef != "":
		return proxyclient.OutcomeAcked, p.RailRef, "", "the rail took the payment"
	case p.Status == railclient.StatusDeclined:
		code := p.DeclineCode
		if code == "" {
			code = "declined"
		}
		return proxyclient.OutcomeRejected, p.RailRef, code, "the rail declined the payment"
	default:
		return proxyclient.OutcomeTimeout, "", "rail_answer_unparseable",
			fmt.Sprintf("the rail answered with status %q and rail_ref %q", p.Status, p.RailRef)
	}
}

func (s *Server) crash(log *slog.Logger, point string) {
	if s.cfg.crashPoint == point {
		log.Error("crash point reached: exiting", "crash_point", point)
		os.Exit(3)
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) error {
	payoutID := chi.URLParam(r, "payout_id")
	all := r.URL.Query().Get("all")
	switch all {
	case "", "false":
	case "true":
		items, err := s.st.all(r.Context(), payoutID)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, proxyclient.RecordPage{Items: items})
		return nil
	default:
		return problem.New(problem.InvalidRequest, "query parameter all must be true or false, got %q", all)
	}
	rec, err := s.st.current(r.Context(), payoutID)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem.New(problem.NotFound, "payout %s has no submission at the proxy: it was never forwarded", payoutID)
	}
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, rec)
	return nil
}

// evidence is what a resolution is recorded with: the rail's answer.
type evidence struct {
	Source    string                    `json:"source"`
	ClientRef string                    `json:"client_ref"`
	Final     bool                      `json:"final"`
	Items     []proxyclient.RailPayment `json:"items"`
	AskedAt   time.Time                 `json:"asked_at"`
}

func (s *Server) lookup(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	payoutID := chi.URLParam(r, "payout_id")
	if r.ContentLength != 0 {
		var body struct{}
		if err := httpx.DecodeJSON(r, &body); err != nil {
			return err
		}
	}
	log := httpx.Log(ctx).With(obs.KeyPayoutID, payoutID)
	rec, err := s.st.forwarded(ctx, payoutID)
	if errors.Is(err, pgx.ErrNoRows) {
		return problem.New(problem.NotFound, "payout %s has no forwarded submission: nothing can have reached the rail", payoutID)
	}
	if err != nil {
		return err
	}
	if rec.Resolution != proxyclient.ResolutionNone {
		var ev evidence
		_ = json.Unmarshal(rec.ResolutionEvidence, &ev)
		httpx.WriteJSON(w, http.StatusOK, proxyclient.LookupResult{
			Final: true, Resolution: rec.Resolution, RailItems: nonNil(ev.Items), Submission: rec,
			Detail: "already resolved; the recorded evidence is returned",
		})
		return nil
	}
	l, err := s.rail.Find(ctx, rec.ClientRef)
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "could not ask the rail about client reference %s; nothing recorded", rec.ClientRef)
	}
	ev := evidence{Source: "rail_lookup", ClientRef: rec.ClientRef, Final: l.Final, Items: []proxyclient.RailPayment{}, AskedAt: time.Now().UTC()}
	settled := 0
	for _, p := range l.Items {
		if p.ClientRef != rec.ClientRef {
			continue // not evidence about this payout
		}
		ev.Items = append(ev.Items, proxyclient.RailPayment(p))
		if p.Status == railclient.StatusSettled {
			settled++
		}
	}
	if settled > 1 {
		log.Error("the rail holds more than one settled payment for one client reference: money moved twice",
			obs.KeyEvent, "duplicate_payment", "client_ref", rec.ClientRef, "settled", settled)
	}
	out := proxyclient.LookupResult{Final: l.Final, RailItems: ev.Items, Submission: rec}
	if !l.Final {
		out.Detail = "the rail's answer is not final yet (its settlement window has not passed); nothing recorded"
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	out.Resolution = proxyclient.ResolutionAbsent
	if settled > 0 {
		out.Resolution = proxyclient.ResolutionSettled
	}
	if !rec.Outcome.Ambiguous() {
		out.Detail = fmt.Sprintf("the outcome %s is not ambiguous; nothing recorded", rec.Outcome)
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	if _, running := s.inflight.Load(payoutID); running {
		out.Final, out.Resolution = false, proxyclient.ResolutionNone
		out.Detail = "the rail call of this submission is still running; nothing recorded"
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	raw, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	defer cancel()
	updated, ok, err := s.st.recordResolution(wctx, rec.ID, out.Resolution, raw, s.cfg.RailTimeout)
	if err != nil {
		return problem.Wrap(problem.Unavailable, err, "could not record the resolution")
	}
	if ok {
		out.Recorded, out.Submission = true, updated
		s.m.resolutions.WithLabelValues(string(out.Resolution)).Inc()
		log.Info("ambiguous submission resolved from rail evidence", "resolution", string(out.Resolution),
			"outcome", outcomeText(rec.Outcome), "client_ref", rec.ClientRef, "rail_items", len(ev.Items))
		httpx.WriteJSON(w, http.StatusOK, out)
		return nil
	}
	// Not written: resolved concurrently, or forwarding may still be under way.
	now, err := s.st.forwarded(wctx, payoutID)
	if err != nil {
		return err
	}
	out.Submission = now
	if now.Resolution != proxyclient.ResolutionNone {
		out.Resolution = now.Resolution
		out.Detail = "resolved concurrently by another lookup; the recorded resolution is returned"
	} else {
		out.Final, out.Resolution = false, proxyclient.ResolutionNone
		out.Detail = fmt.Sprintf("the submission has no outcome and is younger than the rail timeout (%s): its forwarding may still be under way; nothing recorded", s.cfg.RailTimeout)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

func nonNil(p []proxyclient.RailPayment) []proxyclient.RailPayment {
	if p == nil {
		return []proxyclient.RailPayment{}
	}
	return p
}

const (
	defaultLimit = 100
	maxLimit     = 1000
)

func pageParams(r *http.Request) (after string, limit int, err error) {
	q := r.URL.Query()
	limit = defaultLimit
	if v := q.Get("limit"); v != "" {
		n, perr := strconv.Atoi(v)
		if perr != nil || n < 1 || n > maxLimit {
			return "", 0, problem.New(problem.InvalidRequest, "limit must be an integer between 1 and %d, got %q", maxLimit, v)
		}
		limit = n
	}
	return q.Get("after"), limit, nil
}

func idCursor(after string) (int64, error) {
	if after == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(after, 10, 64)
	if err != nil || n < 0 {
		return 0, problem.New(problem.InvalidRequest, "after must be a cursor from a previous page (a non-negative integer), got %q", after)
	}
	return n, nil
}

// idPaged serves a list paged by row id (?after=<id>&limit=).
func idPaged[P any](read func(ctx context.Context, after int64, limit int) (P, error)) http.HandlerFunc {
	return httpx.Handler(func(w http.ResponseWriter, r *http.Request) error {
		after, limit, err := pageParams(r)
		if err != nil {
			return err
		}
		id, err := idCursor(after)
		if err != nil {
			return err
		}
		p, err := read(r.Context(), id, limit)
		if err != nil {
			return err
		}
		httpx.WriteJSON(w, http.StatusOK, p)
		return nil
	})
}

func (s *Server) highFence(w http.ResponseWriter, r *http.Request) error {
	t, err := s.st.highFence(r.Context())
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, proxyclient.HighToken{Token: t})
	return nil
}

func (s *Server) highWater(w http.ResponseWriter, r *http.Request) error {
	after, limit, err := pageParams(r)
	if err != nil {
		return err
	}
	p, err := s.st.highWater(r.Context(), after, limit)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, p)
	return nil
}
