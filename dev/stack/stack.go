// Package devstack runs the whole system on this machine: a throwaway
// PostgreSQL cluster, embedded etcd, and every server role as a child
// process of the same binary. It backs `payouts dev up` and `dev demo`.
package stack

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/migrations"
)

// Options configures the stack.
type Options struct {
	Dir string
	// PortBase fixes the ports: lock +1, payment +2, proxy +3, rail +4,
	// PostgreSQL +5, etcd client +6, etcd peer +7. 0 picks free ports.
	PortBase int
	// Binary is the payouts executable to run the roles with (default: this one).
	Binary string
	Logger *slog.Logger
	// SettlementWindow is passed to the rail stub.
	SettlementWindow time.Duration
	// RailTimeout is the proxy's timeout for a rail call.
	RailTimeout time.Duration
	// EtcdNodes is the size of the embedded etcd cluster (default 1). With
	// more than one, only the first member's ports follow PortBase.
	EtcdNodes int
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
}

// Tokens are the generated bearer tokens, one per caller role.
type Tokens struct {
	Executor   string `json:"executor"`
	Reconciler string `json:"reconciler"`
	Operator   string `json:"operator"`
	Proxy      string `json:"proxy"` // the rail proxy's credential at the rail
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
	children map[string]*child
	failed   chan error
	authFile string
}

type child struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  *os.File
}

type ports struct{ lock, payment, proxy, rail, pg, etcdClient, etcdPeer int }

func choosePorts(base int) (ports, error) {
	if base > 0 {
		p := ports{base + 1, base + 2, base + 3, base + 4, base + 5, base + 6, base + 7}
		for _, n := range []int{p.lock, p.payment, p.proxy, p.rail, p.pg, p.etcdClient, p.etcdPeer} {
			if !infra.PortFree(n) {
				return p, fmt.Errorf("port %d is already in use (another `payouts dev up`?); stop it or choose --port-base", n)
			}
		}
		return p, nil
	}
	var out [7]int
	for i := range out {
		n, err := infra.FreePort()
		if err != nil {
			return ports{}, err
		}
		out[i] = n
	}
	return ports{out[0], out[1], out[2], out[3], out[4], out[5], out[6]}, nil
}

func randomToken() string {
	var b [24]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// loadOrCreateAuth keeps one token per role in DIR/auth.json, reused across runs.
func loadOrCreateAuth(path string) (Tokens, error) {
	var f auth.File
	if b, err := os.ReadFile(path); err == nil {
		if err := json.Unmarshal(b, &f); err != nil {
			return Tokens{}, fmt.Errorf("read %s: %w", path, err)
		}
	} else {
		f.Tokens = []auth.FileToken{
			{Token: randomToken(), Role: auth.Executor, Name: "dev-executor"},
			{Token: randomToken(), Role: auth.Reconciler, Name: "dev-reconciler"},
			{Token: randomToken(), Role: auth.Operator, Name: "dev-operator"},
			{Token: randomToken(), Role: auth.Proxy, Name: "dev-proxy"},
		}
		b, _ := json.MarshalIndent(f, "", "  ")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			return Tokens{}, err
		}
	}
	var t Tokens
	for _, e := range f.Tokens {
		switch e.Role {
		case auth.Executor:
			t.Executor = e.Token
		case auth.Reconciler:
			t.Reconciler = e.Token
		case auth.Operator:
			t.Operator = e.Token
		case auth.Proxy:
			t.Proxy = e.Token
		}
	}
	if t.Executor == "" || t.Reconciler == "" || t.Operator == "" || t.Proxy == "" {
		return t, fmt.Errorf("%s lacks a token for some role; delete it to regenerate", path)
	}
	return t, nil
}

// Start brings the stack up and returns when every role answers /readyz.
func Start(ctx context.Context, opts Options) (*Stack, error) {
	if opts.Dir == "" {
		return nil, errors.New("devstack: --dir is required")
	}
	dir, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = dir
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Binary == "" {
		if opts.Binary, err = os.Executable(); err != nil {
			return nil, err
		}
	}
	if opts.SettlementWindow == 0 {
		opts.SettlementWindow = 3 * time.Second
	}
	if opts.RailTimeout == 0 {
		opts.RailTimeout = 2 * time.Second
	}
	if opts.EtcdNodes == 0 {
		opts.EtcdNodes = 1
	}
	if err := os.MkdirAll(filepath.Join(dir, "logs"), 0o755); err != nil {
		return nil, err
	}
	p, err := choosePorts(opts.PortBase)
	if err != nil {
		return nil, err
	}
	s := &Stack{opts: opts, children: map[string]*child{}, failed: make(chan error, 8)}
	ok := false
	defer func() {
		if !ok {
			s.Stop()
		}
	}()
	s.authFile = filepath.Join(dir, "auth.json")
	tokens, err := loadOrCreateAuth(s.authFile)
	if err != nil {
		return nil, err
	}

	opts.Logger.Info("starting PostgreSQL", "dir", filepath.Join(dir, "pg"), "port", p.pg)
	s.pg, err = infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(dir, "pg"), Port: p.pg, Fsync: true})
	if err != nil {
		return nil, err
	}
	if err := s.pg.Start(ctx); err != nil {
		return nil, err
	}
	urls := DatabaseURLs{PayDB: s.pg.URL("paydb"), ProxyDB: s.pg.URL("proxydb"), LockDB: s.pg.URL("lockdb")}
	for db, url := range map[migrations.DB]string{migrations.PayDB: urls.PayDB, migrations.ProxyDB: urls.ProxyDB, migrations.LockDB: urls.LockDB} {
		if err := s.pg.CreateDatabase(ctx, string(db), ""); err != nil {
			return nil, fmt.Errorf("create %s: %w", db, err)
		}
		if err := migrations.Apply(ctx, db, url); err != nil {
			return nil, fmt.Errorf("migrate %s: %w", db, err)
		}
	}

	opts.Logger.Info("starting embedded etcd", "dir", filepath.Join(dir, "etcd"), "members", opts.EtcdNodes)
	s.etcd, err = infra.StartEtcd(ctx, filepath.Join(dir, "etcd"), opts.EtcdNodes, p.etcdClient, p.etcdPeer)
	if err != nil {
		return nil, err
	}

	url := func(port int) string { return "http://127.0.0.1:" + strconv.Itoa(port) }
	s.Ready = Ready{
		Tokens: tokens, DatabaseURLs: urls, PIDs: map[string]int{"dev": os.Getpid()},
		Etcd: s.etcd.Endpoints(), Logs: map[string]string{}, Dir: dir,
	}
	if pid, err := s.postmasterPID(); err == nil {
		s.Ready.PIDs["postgres"] = pid
	}
	// With fixed ports each role listens where the ready line says. With
	// free ports each role binds port 0 itself and the stack reads the
	// address it logs: a port picked here and bound later by the child could
	// be taken by anything on the machine in between, and a readiness probe
	// would then be answered by someone else's server.
	listen := func(port int) string {
		if opts.PortBase == 0 {
			return "127.0.0.1:0"
		}
		return "127.0.0.1:" + strconv.Itoa(port)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	start := func(name string, port int, args ...string) (string, error) {
		args = append(args, "--listen", listen(port), "--auth-file", s.authFile)
		offset := fileSize(filepath.Join(dir, "logs", name+".log"))
		if err := s.startChild(name, args...); err != nil {
			return "", err
		}
		if opts.PortBase != 0 {
			return url(port), nil
		}
		addr, err := s.waitListening(rctx, name, offset)
		if err != nil {
			return "", err
		}
		return "http://" + addr, nil
	}
	if s.Ready.RailURL, err = start("rail", p.rail, "serve", "rail", "--settlement-window", opts.SettlementWindow.String()); err != nil {
		return nil, err
	}
	if s.Ready.LockURL, err = start("lock", p.lock, "serve", "lock", "--backend", "etcd", "--etcd-endpoints", strings.Join(s.etcd.Endpoints(), ",")); err != nil {
		return nil, err
	}
	if s.Ready.PaymentURL, err = start("payment", p.payment, "serve", "payment", "--database-url", urls.PayDB); err != nil {
		return nil, err
	}
	if s.Ready.ProxyURL, err = start("proxy", p.proxy, "serve", "proxy", "--database-url", urls.ProxyDB, "--rail-url", s.Ready.RailURL,
		"--rail-token", tokens.Proxy, "--rail-timeout", opts.RailTimeout.String()); err != nil {
		return nil, err
	}
	for name, u := range map[string]string{"rail": s.Ready.RailURL, "lock": s.Ready.LockURL, "payment": s.Ready.PaymentURL, "proxy": s.Ready.ProxyURL} {
		if err := s.waitReady(rctx, name, u); err != nil {
			return nil, err
		}
	}
	ok = true
	return s, nil
}

func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}

// waitListening reads a child's log from offset until it logs the address
// it listens on (httpx logs {"msg":"listening","addr":...} once bound).
func (s *Stack) waitListening(ctx context.Context, name string, offset int64) (string, error) {
	s.mu.Lock()
	c := s.children[name]
	path := s.Ready.Logs[name]
	s.mu.Unlock()
	for {
		if b, err := os.ReadFile(path); err == nil && int64(len(b)) >= offset {
			for _, line := range strings.Split(string(b[offset:]), "\n") {
				var rec struct {
					Msg  string `json:"msg"`
					Addr string `json:"addr"`
				}
				if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
					return rec.Addr, nil
				}
			}
		}
		select {
		case <-c.done:
			return "", fmt.Errorf("%s exited during start; see %s:\n%s", name, path, tailFile(path, 15))
		case <-ctx.Done():
			return "", fmt.Errorf("%s never logged its listen address: %w; see %s", name, ctx.Err(), path)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Stack) postmasterPID() (int, error) {
	b, err := os.ReadFile(filepath.Join(s.pg.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(strings.SplitN(string(b), "\n", 2)[0]))
}

// StartRole runs one more child of the binary (e.g. an executor) under the
// stack's supervision: its output goes to DIR/logs/NAME.log and it is
// stopped with the stack. Its exit is not a stack failure.
func (s *Stack) StartRole(name string, args ...string) (*exec.Cmd, error) {
	if err := s.spawn(name, false, args...); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.children[name].cmd, nil
}

func (s *Stack) startChild(name string, args ...string) error { return s.spawn(name, true, args...) }

func (s *Stack) spawn(name string, essential bool, args ...string) error {
	logPath := filepath.Join(s.opts.Dir, "logs", name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(s.opts.Binary, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = os.Environ()
	// Children die with us even if we are killed without a chance to clean up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, done: make(chan struct{}), log: f}
	s.mu.Lock()
	s.children[name] = c
	s.Ready.PIDs[name] = cmd.Process.Pid
	s.Ready.Logs[name] = logPath
	s.mu.Unlock()
	go func() {
		err := cmd.Wait()
		f.Close()
		close(c.done)
		if essential {
			select {
			case s.failed <- fmt.Errorf("%s exited (%v); see %s", name, err, logPath):
			default:
			}
		}
	}()
	return nil
}

func (s *Stack) waitReady(ctx context.Context, name, url string) error {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited during start; see %s:\n%s", name, s.Ready.Logs[name], tailFile(s.Ready.Logs[name], 15))
		case <-ctx.Done():
			return fmt.Errorf("%s not ready at %s: %w; see %s", name, url, ctx.Err(), s.Ready.Logs[name])
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func tailFile(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Failed delivers an error when an essential child exits on its own.
func (s *Stack) Failed() <-chan error { return s.failed }

// StopRole stops one child (SIGTERM, then SIGKILL after grace).
func (s *Stack) StopRole(name string, grace time.Duration) {
	s.mu.Lock()
	c := s.children[name]
	s.mu.Unlock()
	if c == nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// Stop stops every child, etcd and PostgreSQL.
func (s *Stack) Stop() error {
	s.mu.Lock()
	names := make([]string, 0, len(s.children))
	for n := range s.children {
		names = append(names, n)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Add(1)
		go func(n string) { defer wg.Done(); s.StopRole(n, 20*time.Second) }(n)
	}
	wg.Wait()
	if s.etcd != nil {
		s.etcd.Close()
	}
	var err error
	if s.pg != nil {
		err = s.pg.Stop()
	}
	return err
}

// PG is the stack's PostgreSQL cluster.
func (s *Stack) PG() *infra.PGCluster { return s.pg }

// Etcd is the stack's embedded etcd cluster (members can be stopped and
// restarted, e.g. to make the cluster lose its leader).
func (s *Stack) Etcd() *infra.EtcdCluster { return s.etcd }
