// Package rail is the rail stub (`payouts serve rail`): an in-memory
// stand-in for the external payment network, optionally kept in a state
// file across its restarts (Config.StateFile). It is deliberately not
// idempotent — every accepted payment request is a new payment, so a
// duplicate submission is money moved twice — and it can be made slow and
// ambiguous on purpose (see Faults). Its settlement report is the project's
// oracle for duplicate payments.
package rail

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	randv2 "math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/rail/railclient"
)

// Config configures the rail stub.
type Config struct {
	Addr     string
	Logger   *slog.Logger
	Registry *prometheus.Registry
	Auth     *auth.Authenticator
	TLS      *tls.Config // serve HTTPS (nil: plain HTTP)
	// SettlementWindow is how long after the newest attempt with a client
	// reference a lookup of that reference becomes final.
	SettlementWindow time.Duration
	// Faults are the initial fault settings, used as given: an empty
	// DeclineBeneficiaryPrefix declines no one, as it does when set by
	// PUT /v1/faults; railclient.DefaultFaults are serve rail's.
	Faults railclient.Faults
	// Now is the clock (tests); time.Now when nil.
	Now func() time.Time
	// Rand returns a uniform number in [0,1) (tests); math/rand when nil.
	Rand func() float64
	// StateFile, when set, keeps the payments across restarts: each is
	// appended to it before it is answered, and the file is read back on
	// start (journal.go). Empty: the payments live in memory only.
	StateFile string
}

// Fault mode names, used in logs and the faults metric.
const (
	modeTimeoutAfterAccept = "timeout_after_accept"
	modeDropBeforeAccept   = "drop_before_accept"
	modeErrorAfterAccept   = "error_after_accept"
	modeErrorBeforeAccept  = "error_before_accept"
)

// Server is the rail stub.
type Server struct {
	cfg    Config
	http   *httpx.Server
	prefix string // per-process prefix of rail references

	mu       sync.Mutex
	faults   railclient.Faults
	payments []railclient.Payment
	byRef    map[string][]int     // client_ref -> indexes into payments
	refs     refIndex             // every client_ref, for the paged report
	attempts map[string]time.Time // client_ref -> when its newest attempt (accepted or not) ended
	inflight map[string]int       // client_ref -> attempts still being processed
	// arriving counts payment requests whose body is still being read:
	// their client reference is not known yet, so while any is, no
	// lookup is final.
	arriving int
	started  time.Time
	journal  *journal // nil without Config.StateFile
	// closed: Serve has returned and closed the state file; a payment
	// still being processed is then refused, not kept in memory only.
	closed bool

	paymentsTotal *prometheus.CounterVec
	faultsTotal   *prometheus.CounterVec
}

// New builds the rail stub.
func New(cfg Config) (*Server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = randv2.Float64
	}
	if cfg.SettlementWindow < 0 {
		return nil, fmt.Errorf("rail: settlement window %s is negative", cfg.SettlementWindow)
	}
	if err := ValidateFaults(cfg.Faults); err != nil {
		return nil, fmt.Errorf("rail: %w", err)
	}
	var b [3]byte
	_, _ = rand.Read(b[:])
	s := &Server{
		cfg:      cfg,
		prefix:   "rl-" + hex.EncodeToString(b[:]) + "-",
		faults:   cfg.Faults,
		byRef:    map[string][]int{},
		attempts: map[string]time.Time{},
		inflight: map[string]int{},
		started:  cfg.Now(),
		paymentsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_rail_payments_total", Help: "Payments the rail stub accepted, by status (settled, declined).",
		}, []string{"status"}),
		faultsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_rail_faults_injected_total", Help: "Faults the rail stub injected into payment requests, by mode.",
		}, []string{"mode"}),
	}
	if cfg.StateFile != "" {
		j, ps, err := openJournal(cfg.StateFile, cfg.Logger)
		if err != nil {
			return nil, fmt.Errorf("rail: %w", err)
		}
		// No attempt times are restored: find counts the stub's start as
		// an attempt on every reference, so a lookup is final only a
		// window after the restart, in case one was in flight then.
		for _, p := range ps {
			s.record(p)
		}
		s.journal = j
		cfg.Logger.Info("rail state file read", "file", cfg.StateFile, "payments", len(ps))
	}
	cfg.Registry.MustRegister(s.paymentsTotal, s.faultsTotal)
	s.http = httpx.NewServer(httpx.Config{Role: "rail", Addr: cfg.Addr, Logger: cfg.Logger, Registry: cfg.Registry, Auth: cfg.Auth, TLS: cfg.TLS,
		RequestTimeout: requestTimeout})
	s.routes(s.http.Router())
	return s, nil
}

// Run serves the rail stub until ctx is done.
func Run(ctx context.Context, cfg Config) error {
	s, err := New(cfg)
	if err != nil {
		return err
	}
	if _, err := s.Listen(); err != nil {
		return err
	}
	return s.Serve(ctx)
}

// Listen binds the listen address.
func (s *Server) Listen() (net.Addr, error) { return s.http.Listen() }

// Serve serves until ctx is done, then closes the state file.
func (s *Server) Serve(ctx context.Context) error {
	err := s.http.Serve(ctx)
	if cerr := s.closeJournal(); cerr != nil && err == nil {
		err = cerr
	}
	return err
}

// closeJournal closes the state file, if there is one: a payment still
// being processed (a handler past the shutdown grace) is refused from then
// on rather than made in memory only.
func (s *Server) closeJournal() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.journal == nil {
		return nil
	}
	err := s.journal.close()
	s.journal, s.closed = nil, true
	if err != nil {
		return fmt.Errorf("rail: close the state file: %w", err)
	}
	return nil
}

// Handler is the full HTTP handler.
func (s *Server) Handler() http.Handler { return s.http.Handler() }

func (s *Server) routes(r chi.Router) {
	r.Route("/v1", func(r chi.Router) {
		// Only the rail proxy pays: every other path to the rail would go
		// around both guards. Lookups: the proxy and the reconciler.
		r.With(auth.Require(auth.Proxy)).Post("/payments", httpx.Handler(s.pay))
		r.With(auth.Require(auth.Proxy, auth.Reconciler)).Get("/payments", httpx.Handler(s.find))
		r.Group(func(r chi.Router) {
			r.Use(auth.Require(auth.Operator))
			r.Get("/settlement-report", httpx.Handler(s.report))
			r.Get("/faults", httpx.Handler(s.getFaults))
			r.Put("/faults", httpx.Handler(s.putFaults))
		})
	})
}

// validatePayment applies the limits every role shares (internal/wire).
func validatePayment(p railclient.PaymentRequest) error {
	if err := wire.ValidRef("client_ref", p.ClientRef); err != nil {
		return err
	}
	if err := wire.ValidAmount("amount", p.Amount, false); err != nil {
		return err
	}
	if err := wire.ValidCurrency("currency", p.Currency); err != nil {
		return err
	}
	return wire.ValidRef("beneficiary_ref", p.BeneficiaryRef)
}

func (s *Server) pay(w http.ResponseWriter, r *http.Request) error {
	// An attempt counts from its arrival, before its body is read: a
	// lookup answered final while it is read would say no payment can
	// appear, and then this one could.
	s.mu.Lock()
	s.arriving++
	s.mu.Unlock()
	counted := false
	defer func() {
		if !counted {
			s.mu.Lock()
			s.arriving--
			s.mu.Unlock()
		}
	}()
	var req railclient.PaymentRequest
	if err := httpx.DecodeJSON(r, &req); err != nil {
		return err
	}
	if err := validatePayment(req); err != nil {
		return err
	}
	ctx := r.Context()
	log := httpx.Log(ctx).With("client_ref", req.ClientRef)

	// A lookup is not final while an attempt is being processed (its
	// latency, a held answer), nor for the settlement window after it
	// ended: a payment it makes may still appear.
	s.mu.Lock()
	f := s.faults
	s.inflight[req.ClientRef]++
	s.arriving--
	counted = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.attempts[req.ClientRef] = s.cfg.Now()
		if s.inflight[req.ClientRef]--; s.inflight[req.ClientRef] <= 0 {
			delete(s.inflight, req.ClientRef)
		}
	}()

	if f.LatencyMS > 0 {
		t := time.NewTimer(time.Duration(f.LatencyMS) * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return problem.New(problem.Unavailable, "the caller went away before the rail processed the payment; nothing was paid")
		}
	}
	if s.draw(f.DropBeforeAccept) {
		s.fault(log, modeDropBeforeAccept)
		// Close the connection without an answer: the caller cannot know
		// whether anything happened (here: nothing did).
		panic(http.ErrAbortHandler)
	}
	if s.draw(f.ErrorBeforeAccept) {
		s.fault(log, modeErrorBeforeAccept)
		return problem.New(problem.Unavailable, "rail temporarily unavailable (injected before acceptance)")
	}

	p, err := s.accept(req, f.DeclineBeneficiaryPrefix)
	if err != nil {
		log.Error("could not record the payment in the state file; nothing was paid", obs.KeyError, err.Error())
		return problem.New(problem.Unavailable, "the rail could not record the payment; nothing was paid")
	}
	log.Info("payment accepted", "rail_ref", p.RailRef, "status", p.Status, "amount", p.Amount)

	if s.draw(f.TimeoutAfterAccept) {
		s.fault(log, modeTimeoutAfterAccept)
		// Paid, but never answer: hold the response until the caller gives
		// up (or the server's request deadline passes), then drop the
		// connection.
		<-ctx.Done()
		panic(http.ErrAbortHandler)
	}
	if s.draw(f.ErrorAfterAccept) {
		s.fault(log, modeErrorAfterAccept)
		return problem.New(problem.Internal, "rail internal error (injected after acceptance)")
	}
	httpx.WriteJSON(w, http.StatusOK, p)
	return nil
}

func (s *Server) draw(rate float64) bool { return rate > 0 && s.cfg.Rand() < rate }

func (s *Server) fault(log *slog.Logger, mode string) {
	s.faultsTotal.WithLabelValues(mode).Inc()
	log.Info("fault injected", "mode", mode)
}

// accept makes the payment: from here on, money has moved (or, for a
// declined beneficiary, a decline is on record). With a state file the
// payment is written there first; if that fails, nothing was paid.
func (s *Server) accept(req railclient.PaymentRequest, declinePrefix string) (railclient.Payment, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.cfg.Now()
	p := railclient.Payment{
		RailRef:        fmt.Sprintf("%s%08d", s.prefix, len(s.payments)+1),
		ClientRef:      req.ClientRef,
		Amount:         req.Amount,
		Currency:       req.Currency,
		BeneficiaryRef: req.BeneficiaryRef,
		Status:         railclient.StatusSettled,
		At:             now.UTC().Format(time.RFC3339Nano),
	}
	if declinePrefix != "" && strings.HasPrefix(req.BeneficiaryRef, declinePrefix) {
		p.Status, p.DeclineCode = railclient.StatusDeclined, railclient.DeclineCodeBeneficiary
	}
	if s.closed {
		return p, errors.New("the rail has stopped and its state file is closed")
	}
	if s.journal != nil {
		if err := s.journal.append(p); err != nil {
			return p, err
		}
	}
	s.record(p)
	s.paymentsTotal.WithLabelValues(p.Status).Inc()
	return p, nil
}

// record adds a payment made (by accept, or read from the state file) to
// what lookups and the report read. Called with mu held, or before
// serving.
func (s *Server) record(p railclient.Payment) {
	if len(s.byRef[p.ClientRef]) == 0 {
		s.refs.add(p.ClientRef)
	}
	s.byRef[p.ClientRef] = append(s.byRef[p.ClientRef], len(s.payments))
	s.payments = append(s.payments, p)
}

func (s *Server) find(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "client_ref")
	if err != nil {
		return err
	}
	ref := q.Get("client_ref")
	if err := wire.ValidRef("client_ref", ref); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	out := railclient.Lookup{Items: []railclient.Payment{}}
	for _, i := range s.byRef[ref] {
		out.Items = append(out.Items, s.payments[i])
	}
	// Final once no attempt is being processed and the window has passed
	// since the newest one ended; a reference never seen counts from the
	// rail's own start, since an attempt could have been in flight then.
	since := s.started
	if t, ok := s.attempts[ref]; ok && t.After(since) {
		since = t
	}
	out.Final = s.arriving == 0 && s.inflight[ref] == 0 && s.cfg.Now().Sub(since) >= s.cfg.SettlementWindow
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Server) getFaults(w http.ResponseWriter, r *http.Request) error {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		return err
	}
	s.mu.Lock()
	f := s.faults
	s.mu.Unlock()
	httpx.WriteJSON(w, http.StatusOK, f)
	return nil
}

func (s *Server) putFaults(w http.ResponseWriter, r *http.Request) error {
	var u railclient.FaultsUpdate
	if err := httpx.DecodeJSON(r, &u); err != nil {
		return err
	}
	s.mu.Lock()
	f := s.faults
	set := func(dst *float64, v *float64) {
		if v != nil {
			*dst = *v
		}
	}
	set(&f.TimeoutAfterAccept, u.TimeoutAfterAccept)
	set(&f.DropBeforeAccept, u.DropBeforeAccept)
	set(&f.ErrorAfterAccept, u.ErrorAfterAccept)
	set(&f.ErrorBeforeAccept, u.ErrorBeforeAccept)
	if u.LatencyMS != nil {
		f.LatencyMS = *u.LatencyMS
	}
	if u.DeclineBeneficiaryPrefix != nil {
		f.DeclineBeneficiaryPrefix = *u.DeclineBeneficiaryPrefix
	}
	if err := ValidateFaults(f); err != nil {
		s.mu.Unlock()
		return err
	}
	s.faults = f
	s.mu.Unlock()
	httpx.Log(r.Context()).Info("faults changed", "faults", fmt.Sprintf("%+v", f))
	httpx.WriteJSON(w, http.StatusOK, f)
	return nil
}

// MaxLatencyMS bounds injected latency.
const MaxLatencyMS = 60_000

// requestTimeout is the stub's own deadline for a request: past the
// longest latency it injects, so that a payment made to wait that long is
// still processed (the caller's deadline decides whether it waits).
const requestTimeout = MaxLatencyMS*time.Millisecond + 30*time.Second

// ValidateFaults says what is wrong with fault settings: a rate outside
// 0..1, a latency outside 0..60000 ms, a decline prefix too long.
func ValidateFaults(f railclient.Faults) error {
	rates := []struct {
		name string
		v    float64
	}{
		{modeTimeoutAfterAccept, f.TimeoutAfterAccept},
		{modeDropBeforeAccept, f.DropBeforeAccept},
		{modeErrorAfterAccept, f.ErrorAfterAccept},
		{modeErrorBeforeAccept, f.ErrorBeforeAccept},
	}
	for _, r := range rates {
		if !(r.v >= 0 && r.v <= 1) { // also rejects NaN
			return wire.BadField(r.name, "must be a rate between 0 and 1, got %v", r.v)
		}
	}
	if f.LatencyMS < 0 || f.LatencyMS > MaxLatencyMS {
		return wire.BadField("latency_ms", "must be between 0 and %d, got %d", MaxLatencyMS, f.LatencyMS)
	}
	// Held to what a beneficiary_ref may hold (empty: decline no one).
	return wire.ValidText("decline_beneficiary_prefix", f.DeclineBeneficiaryPrefix, wire.MaxRefLen, false, true)
}
