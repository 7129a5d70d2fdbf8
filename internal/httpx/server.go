// Package httpx is the HTTP plumbing every role shares: a router with
// request ids, logging, metrics, deadlines and auth; strict JSON decoding;
// problem+json errors; the server lifecycle; and a client base.
package httpx

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/wire"
)

// Check is a readiness probe of one dependency.
type Check func(ctx context.Context) error

// Config describes one server.
type Config struct {
	Role            string
	Addr            string
	Logger          *slog.Logger
	Registry        *prometheus.Registry
	Auth            *auth.Authenticator
	RequestTimeout  time.Duration // per-request deadline; default 30s
	ShutdownTimeout time.Duration // grace for in-flight requests; default 15s
	Ready           []Check       // /readyz probes
	// TLS, when set, makes the server speak only HTTPS (ServerTLS builds it
	// from --tls-cert-file, --tls-key-file and --tls-client-ca-file).
	TLS *tls.Config
}

// Server is an HTTP server with the shared endpoints and middleware.
type Server struct {
	cfg      Config
	root     chi.Router
	api      chi.Router
	draining atomic.Bool
	ln       net.Listener
	srv      *http.Server
	metrics  *httpMetrics
	refusals refusalLog
	// open counts the requests being served, for the shutdown's last
	// line: how many the grace cut off.
	open atomic.Int64
}

type httpMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	refused  *prometheus.CounterVec
}

// NewServer builds the router: /healthz, /readyz, /version and /metrics
// unauthenticated, everything mounted with API authenticated.
func NewServer(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 30 * time.Second
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 15 * time.Second
	}
	s := &Server{cfg: cfg}
	s.metrics = &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_http_requests_total", Help: "HTTP requests served, by route and status.",
		}, []string{"method", "route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "payouts_http_request_duration_seconds", Help: "HTTP request latency, by route and status.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"method", "route", "status"}),
		// Exported at 0 from the start: PayoutsCredentialRefused counts
		// its increase, which a series born at its first refusal lacks.
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "payouts_http_credential_refusals_total", Help: "Requests refused for their credential: 401 (not authenticated) or 403 (the role may not call the route).",
		}, []string{"status"}),
	}
	for _, st := range []string{"401", "403"} {
		s.metrics.refused.WithLabelValues(st)
	}
	cfg.Registry.MustRegister(s.metrics.requests, s.metrics.latency, s.metrics.refused)

	r := chi.NewRouter()
	r.Use(s.instrument)
	// HEAD is answered wherever GET is (RFC 9110 §9.3.2), by the GET
	// route with the body left out: probes and load balancers send it.
	r.Use(middleware.GetHead)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		problem.Write(w, problem.New(problem.NotFound, "no route for %s %s", r.Method, r.URL.Path))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, req *http.Request) { methodNotAllowed(r, w, req) })
	r.Get("/healthz", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	r.Get("/version", func(w http.ResponseWriter, r *http.Request) {
		WriteJSON(w, http.StatusOK, obs.Build())
	})
	r.Get("/readyz", s.readyz)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{Registry: cfg.Registry}))
	s.root = r
	s.api = r.With(s.deadline, s.authenticate, queryOnlyOnReads)
	s.api.Get(WhoAmIPath, whoAmI)
	return s
}

// WhoAmIPath is the route every server has that answers a caller of any
// role with the identity its token has on that server (auth.Identity): a
// client checks at start that it was given the credential of the role it
// needs, before doing anything a later refusal would leave half done.
const WhoAmIPath = "/v1/whoami"

func whoAmI(w http.ResponseWriter, r *http.Request) {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		problem.Write(w, err)
		return
	}
	p, ok := auth.FromContext(r.Context())
	if !ok {
		problem.Write(w, problem.New(problem.Unauthorized, "not authenticated"))
		return
	}
	WriteJSON(w, http.StatusOK, auth.Identity{Role: p.Role, Name: p.Name, AnyRole: p.AnyRole})
}

// queryOnlyOnReads refuses a query string on a request that is not a read
// (400 invalid_request naming the first parameter): no endpoint that
// changes something takes one, and a parameter it ignored would be a
// request silently not honoured (acquire?wait_ms=5000 acquiring without
// waiting; POST /v1/payouts?dry_run=true creating the payout). Reads check
// their own parameters.
func queryOnlyOnReads(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.RawQuery != "" && r.Method != http.MethodGet && r.Method != http.MethodHead {
			if _, err := wire.Query(r.URL.RawQuery); err != nil {
				problem.Write(w, err)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// Router is where a role mounts its authenticated API routes.
func (s *Server) Router() chi.Router { return s.api }

// Handler is the server's full handler (for tests with httptest).
func (s *Server) Handler() http.Handler { return s.root }

// Logger is the server's logger.
func (s *Server) Logger() *slog.Logger { return s.cfg.Logger }

func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		problem.Write(w, problem.New(problem.Unavailable, "shutting down"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	for _, c := range s.cfg.Ready {
		if err := c(ctx); err != nil {
			s.cfg.Logger.Warn("readiness check failed", obs.KeyError, err.Error())
			problem.Write(w, problem.New(problem.Unavailable, "a dependency is not reachable"))
			return
		}
	}
	WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func (s *Server) authenticate(next http.Handler) http.Handler {
	if s.cfg.Auth == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			problem.Write(w, problem.New(problem.Unauthorized, "server has no authentication configured"))
		})
	}
	return s.cfg.Auth.Middleware(next, s.routed)
}

// routed reports whether some route has the request's path and method (a
// mounted router's routes included).
func (s *Server) routed(r *http.Request) bool {
	method := r.Method
	if rctx := chi.RouteContext(r.Context()); rctx != nil && rctx.RouteMethod != "" {
		method = rctx.RouteMethod // GET for a HEAD (GetHead)
	}
	return s.root.Match(chi.NewRouteContext(), method, routePath(r))
}

func (s *Server) deadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.RequestTimeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

type loggerKey struct{}

// requestLog is a request's logger, built only when the request logs:
// slog's With formats the request id into a new handler, which most
// requests (logging nothing at the configured level) never need.
type requestLog struct {
	base *slog.Logger
	rid  string
	l    atomic.Pointer[slog.Logger]
}

func (r *requestLog) logger() *slog.Logger {
	if l := r.l.Load(); l != nil {
		return l
	}
	l := r.base.With(obs.KeyRequestID, r.rid)
	r.l.Store(l)
	return l
}

// Log returns the request-scoped logger (carrying the request id).
func Log(ctx context.Context) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*requestLog); ok {
		return l.logger()
	}
	return slog.Default()
}

type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// newRequestID is 16 hex digits: a correlation id, not a secret, so it
// comes from the runtime's cheap per-thread generator.
func newRequestID() string {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], rand.Uint64())
	return hex.EncodeToString(b[:])
}

// writeGrace is how long past a request's deadline its answer may take to
// be written before the connection is cut.
const writeGrace = 10 * time.Second

// v1Unrouted labels the requests under /v1 that no route takes (404, 405,
// and a 401 answered before routing) in the request metrics.
const v1Unrouted = "/v1/*"

// instrument adds a request id, a request-scoped logger, panic recovery,
// an access log line and the request metrics.
func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		s.open.Add(1)
		defer s.open.Add(-1)
		rid := r.Header.Get("X-Request-Id")
		if rid == "" || len(rid) > 64 {
			rid = newRequestID()
		}
		w.Header().Set("X-Request-Id", rid)
		// A client that stops reading its answer holds the handler (and
		// the connection) only until the answer's deadline: the request's
		// own, and then writeGrace to deliver what it answered.
		_ = http.NewResponseController(w).SetWriteDeadline(start.Add(s.cfg.RequestTimeout + writeGrace))
		log := &requestLog{base: s.cfg.Logger, rid: rid}
		rec := &statusRecorder{ResponseWriter: w}
		r = r.WithContext(context.WithValue(r.Context(), loggerKey{}, log))
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				log.logger().Error("panic serving request", "panic", fmt.Sprint(v), "method", r.Method, "path", r.URL.Path)
				if rec.status == 0 {
					problem.Write(rec, problem.New(problem.Internal, "internal error"))
				}
			}
			route := "unmatched"
			if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
				route = rc.RoutePattern()
			}
			if (route == "unmatched" || route == "/v1") && (r.URL.Path == "/v1" || strings.HasPrefix(r.URL.Path, "/v1/")) {
				// No route took it (a method no router knows finds no
				// pattern at all): one label for all such requests.
				route = v1Unrouted
			}
			status := rec.status
			if status == 0 {
				status = http.StatusOK
			}
			st := strconv.Itoa(status)
			d := time.Since(start)
			method := metricMethod(r.Method)
			s.metrics.requests.WithLabelValues(method, route, st).Inc()
			s.metrics.latency.WithLabelValues(method, route, st).Observe(d.Seconds())
			if status == http.StatusUnauthorized || status == http.StatusForbidden {
				s.metrics.refused.WithLabelValues(st).Inc()
				s.refusals.note(r.Context(), log.logger(), r, route, status, start.Add(d))
			} else if route != "/healthz" && route != "/readyz" && route != "/metrics" && route != "/version" {
				lvl := slog.LevelDebug
				if status >= 500 {
					lvl = slog.LevelWarn
				}
				if s.cfg.Logger.Enabled(r.Context(), lvl) {
					log.logger().Log(r.Context(), lvl, "request", "method", r.Method, "route", route, "status", status, "duration_ms", float64(d.Microseconds())/1000)
				}
			}
		}()
		next.ServeHTTP(rec, r)
	})
}

// Handler adapts a function returning an error: a non-nil error is written
// as a problem and, when internal, logged with its cause.
func Handler(fn func(w http.ResponseWriter, r *http.Request) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			WriteError(w, r, err)
		}
	}
}

// WriteError writes err as a problem, logging causes of server-side errors.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	e := problem.From(err)
	switch {
	case e.Status() >= 500 && errors.Is(err, context.Canceled) && r.Context().Err() != nil:
		// The caller went away: nobody reads the answer, and nothing failed.
		Log(r.Context()).Info("request cancelled: the caller went away", obs.KeyError, err.Error(), "method", r.Method, "path", r.URL.Path)
	case e.Status() >= 500:
		Log(r.Context()).Error("request failed", "code", string(e.Code), obs.KeyError, err.Error(), "method", r.Method, "path", r.URL.Path)
	}
	problem.Write(w, e)
}

// Listen binds the server's address (so callers learn the port of ":0").
func (s *Server) Listen() (net.Addr, error) {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", s.cfg.Addr, err)
	}
	if s.cfg.TLS != nil {
		ln = tls.NewListener(ln, s.cfg.TLS)
	}
	s.ln = ln
	if path := os.Getenv(AddrFileEnv); path != "" {
		if err := writeAddrFile(path, ln.Addr().String()); err != nil {
			ln.Close()
			return nil, err
		}
	}
	return ln.Addr(), nil
}

// AddrFileEnv names a file a server writes its bound address (host:port)
// to once it listens, for the process that started it: a supervisor learns
// the port of ":0" from it rather than from the log.
const AddrFileEnv = "PAYOUTS_ADDR_FILE"

// writeAddrFile writes addr to path atomically (a reader never sees it
// half written).
func writeAddrFile(path, addr string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(addr+"\n"), 0o644); err != nil {
		return fmt.Errorf("%s: %w", AddrFileEnv, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("%s: %w", AddrFileEnv, err)
	}
	return nil
}

// Serve runs until ctx is done, then drains: /readyz turns 503 and
// in-flight requests get ShutdownTimeout to finish.
func (s *Server) Serve(ctx context.Context) error {
	if s.ln == nil {
		if _, err := s.Listen(); err != nil {
			return err
		}
	}
	s.srv = &http.Server{
		Handler:           s.root,
		ReadHeaderTimeout: readHeaderTimeout,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.cfg.Logger.Info("listening", "addr", s.ln.Addr().String(), "tls", s.cfg.TLS != nil)
	errc := make(chan error, 1)
	go func() { errc <- s.srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	s.cfg.Logger.Info("shutting down", "grace", s.cfg.ShutdownTimeout.String())
	began := time.Now()
	if err := s.srv.Shutdown(sctx); err != nil {
		// Said, or the log would end at "shutting down" with no word of
		// the requests cut off (their clients learn nothing of them).
		s.cfg.Logger.Warn("shutdown grace ran out with requests still open; stopping without them",
			"grace", s.cfg.ShutdownTimeout.String(), "open_requests", s.open.Load(), obs.KeyError, err.Error())
		return fmt.Errorf("http shutdown: %w", err)
	}
	if err := <-errc; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	s.cfg.Logger.Info("stopped", "took", time.Since(began).Round(time.Millisecond).String())
	return nil
}
