// Package stack runs the whole system on this machine: a throwaway
// PostgreSQL cluster, embedded etcd, and every server role as a child
// process of the same binary. It backs `payouts dev up` and `dev demo`.
package stack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/dev/supervise"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/migrations"
)

// DefaultRailTimeout is the stack proxy's --rail-timeout unless Options
// says otherwise. Every proxy over one proxydb must run the same one: a
// proxy resolves a submission by the send window its own flags give.
const DefaultRailTimeout = 2 * time.Second

// Options configures the stack.
type Options struct {
	Dir string
	// PortBase fixes the ports: lock +1, payment +2, proxy +3, rail +4,
	// etcd client +6, etcd peer +7, PostgreSQL +8 (+5 stays free for a
	// reconciler's default --listen). 0 picks free ports.
	PortBase int
	// Binary is the payouts executable to run the roles with (default: this one).
	Binary string
	// Logger receives the stack's own log lines; its level is also the
	// level of the embedded etcd's log (DIR/logs/etcd.log).
	Logger *slog.Logger
	// SettlementWindow is passed to the rail stub.
	SettlementWindow time.Duration
	// RailTimeout is the proxy's timeout for a rail call (default
	// DefaultRailTimeout).
	RailTimeout time.Duration
	// EtcdNodes is the size of the embedded etcd cluster (default 1). With
	// more than one, only the first member's ports follow PortBase.
	EtcdNodes int
	// TLS runs every role over HTTPS with a throwaway CA made for this run
	// (DIR/tls/ca.pem is the CA clients trust).
	TLS bool
	// KeepRailPayments has the rail stub keep its payments in
	// DIR/rail/payments.jsonl across runs, as the databases are kept: a
	// stack started again on the same DIR (dev up) then still has the rail
	// that paid its earlier payouts.
	KeepRailPayments bool
}

// Ready is the ready line of DESIGN §4b.
type Ready struct {
	LockURL      string            `json:"lock_url"`
	PaymentURL   string            `json:"payment_url"`
	ProxyURL     string            `json:"proxy_url"`
	RailURL      string            `json:"rail_url"`
	Tokens       Tokens            `json:"tokens"`
	DatabaseURLs DatabaseURLs      `json:"database_urls"`
	PIDs         map[string]int    `json:"pids"`
	Etcd         []string          `json:"etcd_endpoints"`
	Logs         map[string]string `json:"logs"`
	Dir          string            `json:"dir"`
	// TokenFiles holds each role's token in a file (0600), by role: what
	// children and scripts are given instead of a token on a command line.
	TokenFiles map[string]string `json:"token_files"`
	// TLS is set when the stack runs over HTTPS.
	TLS *TLSFiles `json:"tls,omitempty"`
}

// HTTPClient is a client for the stack's URLs: it trusts the throwaway CA
// when the stack runs over TLS.
func (r Ready) HTTPClient() (*http.Client, error) {
	if r.TLS == nil {
		return httpx.NewHTTPClient(nil), nil
	}
	cfg, err := httpx.ClientTLS(r.TLS.CA, "", "")
	if err != nil {
		return nil, err
	}
	return httpx.NewHTTPClient(cfg), nil
}

// DatabaseURLs are the three databases.
type DatabaseURLs struct {
	PayDB   string `json:"paydb"`
	ProxyDB string `json:"proxydb"`
	LockDB  string `json:"lockdb"`
}

// Stack is a running local system.
type Stack struct {
	opts     Options
	Ready    Ready
	pg       *infra.PGCluster
	etcd     *infra.EtcdCluster
	mu       sync.Mutex
	children map[string]*supervise.Proc
	asked    map[string]bool // children asked to stop (their exit is no failure)
	stopping bool
	failed   chan error
	authFile string
	client   *http.Client // trusts the stack's CA (readiness probes)
	// serving are the URLs the payment resource and the proxy serve
	// paydb and proxydb by: roles with data privileges only
	// (migrations.GrantServing), as in production; Ready's DatabaseURLs
	// are the owner's, for tests and benchmarks that load or inspect.
	serving DatabaseURLs
}

// ServingDatabaseURLs are the URLs, each of a role with data privileges
// only, by which the stack's payment resource and proxy serve paydb and
// proxydb (LockDB is the owner's: no role serves it here).
func (s *Stack) ServingDatabaseURLs() DatabaseURLs { return s.serving }

// servingRoles are the roles the stack's servers use for their databases.
var servingRoles = map[migrations.DB]string{migrations.PayDB: "payouts_payment", migrations.ProxyDB: "payouts_proxy"}

type ports struct{ lock, payment, proxy, rail, pg, etcdClient, etcdPeer int }

// PortLayout is where a stack started with --port-base base listens, by
// what listens there: the four servers at +1..+4 (their own defaults,
// 7101..7104, from the default base), etcd at +6/+7 and PostgreSQL at +8.
// +5 is left free: it is a continuous reconciler's default --listen
// (7105), so a reconciler runs beside a default stack.
func PortLayout(base int) map[string]int {
	p := layout(base)
	return map[string]int{"lock": p.lock, "payment": p.payment, "proxy": p.proxy, "rail": p.rail,
		"postgres": p.pg, "etcd-client": p.etcdClient, "etcd-peer": p.etcdPeer}
}

// PortSpan is the highest offset layout uses above a port base: a base
// above 65535-PortSpan would put a port out of range.
const PortSpan = 8

func layout(base int) ports {
	return ports{lock: base + 1, payment: base + 2, proxy: base + 3, rail: base + 4, etcdClient: base + 6, etcdPeer: base + 7, pg: base + 8}
}

func choosePorts(base int) (ports, error) {
	if base > 0 {
		p := layout(base)
		for _, n := range []int{p.lock, p.payment, p.proxy, p.rail, p.pg, p.etcdClient, p.etcdPeer} {
			if !infra.PortFree(n) {
				return p, fmt.Errorf("port %d is already in use (another `payouts dev up`?); stop it or choose --port-base", n)
			}
		}
		return p, nil
	}
	// The servers bind port 0 themselves (see listen in Start), and etcd
	// and PostgreSQL pick their own (infra.StartEtcdCluster and
	// PGCluster.Start with port 0, each picking again when another process
	// took the port before it could listen). A port chosen here and bound
	// later could be taken in between: under a loaded make test it was.
	return ports{}, nil
}

func (o *Options) defaults() error {
	if o.Dir == "" {
		return errors.New("stack: --dir is required")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return err
	}
	o.Dir = dir
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Binary == "" {
		if o.Binary, err = os.Executable(); err != nil {
			return err
		}
	}
	if o.SettlementWindow == 0 {
		o.SettlementWindow = 3 * time.Second
	}
	if o.RailTimeout == 0 {
		o.RailTimeout = DefaultRailTimeout
	}
	if o.EtcdNodes == 0 {
		o.EtcdNodes = 1
	}
	return nil
}

// Start brings the stack up and returns when every role answers /readyz.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	dir := opts.Dir
	if err := checkNotRunning(dir); err != nil {
		return nil, err
	}
	for _, d := range []string{"logs", "run"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	p, err := choosePorts(opts.PortBase)
	if err != nil {
		return nil, err
	}
	s := &Stack{opts: opts, children: map[string]*supervise.Proc{}, asked: map[string]bool{}, failed: make(chan error, 8)}
	ok := false
	defer func() {
		if !ok {
			_ = s.Stop()
		}
	}()
	if err := os.WriteFile(s.pidFile(), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
		return nil, err
	}
	s.authFile = filepath.Join(dir, "auth.json")
	tokens, tokenFiles, err := loadOrCreateAuth(dir)
	if err != nil {
		return nil, err
	}
	var tlsFiles *TLSFiles
	if opts.TLS {
		f, err := newThrowawayTLS(filepath.Join(dir, "tls"))
		if err != nil {
			return nil, fmt.Errorf("make a throwaway CA: %w", err)
		}
		tlsFiles = &f
	}
	urls, err := s.startPostgres(ctx, p.pg)
	if err != nil {
		return nil, err
	}
	etcdLog := filepath.Join(dir, "logs", "etcd.log")
	opts.Logger.Info("starting embedded etcd", "dir", filepath.Join(dir, "etcd"), "members", opts.EtcdNodes, "log", etcdLog)
	var etcdPorts []int
	if opts.PortBase > 0 {
		etcdPorts = []int{p.etcdClient, p.etcdPeer}
	}
	s.etcd, err = infra.StartEtcdCluster(ctx, infra.EtcdOptions{Dir: filepath.Join(dir, "etcd"), Nodes: opts.EtcdNodes,
		Ports: etcdPorts, LogFile: etcdLog, LogLevel: obs.LevelOf(opts.Logger)})
	if err != nil {
		return nil, fmt.Errorf("embedded etcd did not start: %w", err)
	}
	s.Ready = Ready{
		Tokens: tokens, DatabaseURLs: urls, PIDs: map[string]int{"dev": os.Getpid()},
		Etcd: s.etcd.Endpoints(), Logs: map[string]string{"etcd": etcdLog, "postgres": filepath.Join(dir, "pg", "postgres.log")}, Dir: dir,
		TokenFiles: tokenFiles, TLS: tlsFiles,
	}
	if s.client, err = s.Ready.HTTPClient(); err != nil {
		return nil, err
	}
	if pid, err := s.postmasterPID(); err == nil {
		s.Ready.PIDs["postgres"] = pid
	}
	if err := s.startServers(ctx, p); err != nil {
		return nil, err
	}
	ok = true
	return s, nil
}

// stackPGConf is the stack's PostgreSQL settings beyond infra's. The
// throwaway clusters of unit tests run with 32 MB of shared buffers (a
// quarter of PostgreSQL's default; many of them run at once); the stack's
// one cluster holds every table of a benchmark or a demo, so it gets the
// size a production server would start from: with 32 MB the backends
// evicted and re-read pages all run long (docs/benchmarks-history.md, "A linger
// that covers the next round, the claim's own funds check, shared
// buffers": 3 % less CPU per payout with 256 MB).
var stackPGConf = []string{"autovacuum_naptime=5s", "shared_buffers=256MB"}

func (s *Stack) startPostgres(ctx context.Context, port int) (DatabaseURLs, error) {
	pgDir := filepath.Join(s.opts.Dir, "pg")
	s.opts.Logger.Info("starting PostgreSQL", "dir", pgDir, "port", port) // 0: it picks a free one
	var err error
	// The stack's tables start empty and grow fast. A statement prepared
	// while a table is nearly empty is planned for that size (a
	// sequential scan) and keeps the plan until the table is analyzed
	// again; with autovacuum's default one-minute naptime a whole demo or
	// benchmark can run on such plans. Looking every 5 seconds keeps the
	// statistics, and so the plans, in step with the tables.
	if s.pg, err = infra.NewPGCluster(infra.PGOptions{Dir: pgDir, Port: port, Fsync: true, ExtraConf: stackPGConf}); err != nil {
		return DatabaseURLs{}, err
	}
	if err := s.pg.Start(ctx); err != nil {
		return DatabaseURLs{}, err
	}
	s.opts.Logger.Info("PostgreSQL started", "port", s.pg.Port)
	urls := DatabaseURLs{PayDB: s.pg.URL("paydb"), ProxyDB: s.pg.URL("proxydb"), LockDB: s.pg.URL("lockdb")}
	for db, url := range map[migrations.DB]string{migrations.PayDB: urls.PayDB, migrations.ProxyDB: urls.ProxyDB, migrations.LockDB: urls.LockDB} {
		if err := s.pg.CreateDatabase(ctx, string(db), ""); err != nil {
			return urls, fmt.Errorf("create %s: %w", db, err)
		}
		if err := migrations.Apply(ctx, db, url); err != nil {
			return urls, fmt.Errorf("migrate %s: %w", db, err)
		}
	}
	s.serving = urls
	for db, role := range servingRoles {
		if err := s.pg.CreateRole(ctx, role); err != nil {
			return urls, err
		}
		if err := migrations.GrantServing(ctx, db, s.pg.URL(string(db)), role); err != nil {
			return urls, err
		}
	}
	s.serving.PayDB = s.pg.RoleURL(servingRoles[migrations.PayDB], "paydb")
	s.serving.ProxyDB = s.pg.RoleURL(servingRoles[migrations.ProxyDB], "proxydb")
	return urls, nil
}

// startServers starts the four server roles and waits until each is ready.
// No secret goes on a command line: tokens and database URLs are files.
func (s *Stack) startServers(ctx context.Context, p ports) error {
	opts := s.opts
	// With fixed ports each role listens where the ready line says. With
	// free ports each role binds port 0 itself and reports the address it
	// got through its address file: a port picked here and bound later by
	// the child could be taken by anything on the machine in between.
	listen := func(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	r := &s.Ready
	dbFile := func(name, url string) (string, error) { return writeSecret(opts.Dir, name+".url", url) }
	payDB, err := dbFile("paydb", s.serving.PayDB)
	if err != nil {
		return err
	}
	proxyDB, err := dbFile("proxydb", s.serving.ProxyDB)
	if err != nil {
		return err
	}
	railArgs := []string{"serve", "rail", "--settlement-window", opts.SettlementWindow.String()}
	if opts.KeepRailPayments {
		railDir := filepath.Join(opts.Dir, "rail")
		if err := os.MkdirAll(railDir, 0o700); err != nil {
			return err
		}
		railArgs = append(railArgs, "--state-file", filepath.Join(railDir, "payments.jsonl"))
	}
	if r.RailURL, err = s.startServer(rctx, "rail", listen(p.rail), railArgs...); err != nil {
		return err
	}
	if r.LockURL, err = s.startServer(rctx, "lock", listen(p.lock), "serve", "lock", "--backend", "etcd", "--etcd-endpoints", strings.Join(r.Etcd, ",")); err != nil {
		return err
	}
	if r.PaymentURL, err = s.startServer(rctx, "payment", listen(p.payment), "serve", "payment", "--database-url-file", payDB); err != nil {
		return err
	}
	proxyArgs := []string{"serve", "proxy", "--database-url-file", proxyDB, "--rail-url", r.RailURL,
		"--rail-token-file", r.TokenFiles["proxy"], "--rail-timeout", opts.RailTimeout.String()}
	if r.TLS != nil {
		proxyArgs = append(proxyArgs, "--ca-file", r.TLS.CA)
	}
	if r.ProxyURL, err = s.startServer(rctx, "proxy", listen(p.proxy), proxyArgs...); err != nil {
		return err
	}
	for name, u := range map[string]string{"rail": r.RailURL, "lock": r.LockURL, "payment": r.PaymentURL, "proxy": r.ProxyURL} {
		s.mu.Lock()
		child := s.children[name]
		s.mu.Unlock()
		if err := child.Ready(rctx, s.client, u); err != nil {
			return err
		}
	}
	return nil
}

func (s *Stack) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.pg.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
}

// Stop stops every child, then etcd, then PostgreSQL. It reports a child
// that did not exit 0 when asked to stop, naming its log.
func (s *Stack) Stop() error {
	defer s.removePIDFile()
	var errs []string
	if failed := s.stopChildren(); len(failed) > 0 {
		errs = append(errs, "not stopped cleanly: "+strings.Join(failed, ", "))
	}
	if s.etcd != nil {
		s.etcd.Close()
	}
	if s.pg != nil {
		if err := s.pg.Stop(); err != nil {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return errors.New(strings.Join(errs, "; ")) // one line on a console
	}
	return nil
}

// pidFile is DIR/run/dev.pid: the process that runs the stack in DIR.
func (s *Stack) pidFile() string { return pidFile(s.opts.Dir) }

func pidFile(dir string) string { return filepath.Join(dir, "run", "dev.pid") }

// removePIDFile removes DIR/run/dev.pid if it still names this process.
func (s *Stack) removePIDFile() {
	if pid, _ := readPID(s.pidFile()); pid == os.Getpid() {
		_ = os.Remove(s.pidFile())
	}
}

// checkNotRunning refuses a DIR whose stack is running: its PostgreSQL
// (DIR/pg/data/postmaster.pid names a live process) would otherwise be
// started a second time and fail with pg_ctl's "Examine the log output".
func checkNotRunning(dir string) error {
	pg, _ := readPID(filepath.Join(dir, "pg", "data", "postmaster.pid"))
	if !alive(pg) {
		return nil
	}
	pids := fmt.Sprintf("PostgreSQL pid %d", pg)
	if dev, _ := readPID(pidFile(dir)); alive(dev) && dev != os.Getpid() {
		pids = fmt.Sprintf("dev up pid %d, %s", dev, pids)
	}
	return fmt.Errorf("a stack already runs in %s (%s): use it, stop it first (Ctrl-C where it runs), or give another --dir", dir, pids)
}

// readPID is the process id on the first line of a pid file; 0 when there
// is none.
func readPID(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	first, _, _ := strings.Cut(string(b), "\n")
	return strconv.Atoi(strings.TrimSpace(first))
}

// alive reports whether process pid exists (one of another user, as
// PostgreSQL run as the postgres user is to root's dev up, answers EPERM).
func alive(pid int) bool {
	if pid <= 0 {
		return false
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}

// PG is the stack's PostgreSQL cluster.
func (s *Stack) PG() *infra.PGCluster { return s.pg }

// Etcd is the stack's embedded etcd cluster (members can be stopped and
// restarted, e.g. to make the cluster lose its leader).
func (s *Stack) Etcd() *infra.EtcdCluster { return s.etcd }
