// Package infra starts throwaway infrastructure on this machine: a
// PostgreSQL 15 cluster and embedded etcd. The same code backs the test
// harness and `payouts dev up`, so what the tests exercise is what a
// developer runs.
package infra

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/payouts/payouts/internal/loopback"
)

// PGOptions configures a throwaway PostgreSQL cluster.
type PGOptions struct {
	// Dir holds the cluster (Dir/data) and its socket. Created if absent;
	// an existing initialised cluster is reused.
	Dir string
	// Port to listen on; 0 picks a free loopback port.
	Port int
	// Fsync keeps durability on. Leave it off for unit tests that never
	// crash the server; turn it on for crash and restore scenarios.
	Fsync bool
	// ExtraConf are additional `-c name=value` settings.
	ExtraConf []string
}

// PGCluster is a running (or stopped) local PostgreSQL cluster.
type PGCluster struct {
	opts    PGOptions
	bindir  string
	cred    *syscall.Credential
	mu      sync.Mutex
	running bool
	Port    int
}

// PGBinDir finds the PostgreSQL server binaries (pg_config --bindir).
func PGBinDir() (string, error) {
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		dir := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(dir, "initdb")); err == nil {
			return dir, nil
		}
	}
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(matches) > 0 {
		return filepath.Dir(matches[len(matches)-1]), nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		return filepath.Dir(p), nil
	}
	return "", errors.New("infra: PostgreSQL server binaries not found (install postgresql; pg_config --bindir must contain initdb)")
}

// FreePort returns a currently unused TCP port on 127.0.0.1.
func FreePort() (int, error) { return loopback.FreePort() }

// PortFree reports whether 127.0.0.1:port can be bound now.
func PortFree(port int) bool { return loopback.PortFree(port) }

// postgresCredential returns the credential to run PostgreSQL binaries
// under: the postgres user when we are root (initdb and postgres refuse to
// run as root), nil otherwise.
func postgresCredential() (*syscall.Credential, int, int, error) {
	if os.Geteuid() != 0 {
		return nil, -1, -1, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, 0, 0, fmt.Errorf("infra: running as root needs a 'postgres' user to run the server: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, uid, gid, nil
}

// NewPGCluster initialises (if needed) a cluster under opts.Dir. It does not
// start it.
func NewPGCluster(opts PGOptions) (*PGCluster, error) {
	if opts.Dir == "" {
		return nil, errors.New("infra: PGOptions.Dir is required")
	}
	bindir, err := PGBinDir()
	if err != nil {
		return nil, err
	}
	cred, uid, gid, err := postgresCredential()
	if err != nil {
		return nil, err
	}
	abs, err := filepath.Abs(opts.Dir)
	if err != nil {
		return nil, err
	}
	opts.Dir = abs
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return nil, err
	}
	if uid >= 0 {
		// The server user must own its directories and be able to reach them.
		for d := opts.Dir; d != "/" && d != "."; d = filepath.Dir(d) {
			if st, err := os.Stat(d); err == nil && st.Mode().Perm()&0o001 == 0 {
				_ = os.Chmod(d, st.Mode().Perm()|0o011)
			}
		}
		if err := os.Chown(opts.Dir, uid, gid); err != nil {
			return nil, err
		}
	}
	c := &PGCluster{opts: opts, bindir: bindir, cred: cred}
	if _, err := os.Stat(filepath.Join(c.DataDir(), "PG_VERSION")); errors.Is(err, os.ErrNotExist) {
		if err := c.run(context.Background(), "initdb", "-D", c.DataDir(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// DataDir is the cluster's PGDATA.
func (c *PGCluster) DataDir() string { return filepath.Join(c.opts.Dir, "data") }

// Dir is the directory holding the cluster.
func (c *PGCluster) Dir() string { return c.opts.Dir }

func (c *PGCluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bindir, name), args...)
	if c.cred != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	}
	cmd.Dir = c.opts.Dir
	return cmd
}

func (c *PGCluster) run(ctx context.Context, name string, args ...string) error {
	cmd := c.command(ctx, name, args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("infra: %s %s: %w: %s", name, strings.Join(args, " "), err, lastLine(out.String()))
	}
	return nil
}

// Start starts the server and waits until it accepts connections.
func (c *PGCluster) Start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.running {
		return nil
	}
	if c.Port == 0 {
		c.Port = c.opts.Port
	}
	picked := c.Port == 0
	if !picked && !PortFree(c.Port) {
		return fmt.Errorf("infra: port %d is already in use; choose another port or stop what listens there", c.Port)
	}
	for attempt := 1; ; attempt++ {
		if picked {
			p, err := pickPort()
			if err != nil {
				return err
			}
			c.Port = p
		}
		logged := c.logSize()
		err := c.start(ctx)
		if err == nil {
			c.running = true
			return nil
		}
		// Another process bound the picked port before the server did:
		// pick again.
		if !picked || attempt == portAttempts || ctx.Err() != nil || !c.bindFailed(logged) {
			if picked {
				c.Port = 0
			}
			return err
		}
	}
}

func (c *PGCluster) logPath() string { return filepath.Join(c.opts.Dir, "postgres.log") }

func (c *PGCluster) logSize() int64 {
	fi, err := os.Stat(c.logPath())
	if err != nil {
		return 0
	}
	return fi.Size()
}

// bindFailed reports whether the server's log, past offset from, says it
// could not bind its port.
func (c *PGCluster) bindFailed(from int64) bool {
	b, _ := os.ReadFile(c.logPath())
	if int64(len(b)) < from {
		from = 0
	}
	b = b[from:]
	return bytes.Contains(b, []byte("could not bind")) && bytes.Contains(b, []byte("already in use"))
}

// serverOptions is the server's command line (pg_ctl -o): the port, the
// socket directory and the settings, each given once. A setting of
// ExtraConf replaces infra's own of the same name (the stack's
// shared_buffers=256MB went on the line after infra's 32MB).
func (c *PGCluster) serverOptions() string {
	settings := []string{
		"listen_addresses=127.0.0.1",
		"max_connections=300",
		"shared_buffers=32MB",
	}
	if !c.opts.Fsync {
		settings = append(settings, "fsync=off", "synchronous_commit=off", "full_page_writes=off")
	}
	name := func(setting string) string {
		n, _, _ := strings.Cut(setting, "=")
		return strings.ToLower(strings.TrimSpace(n))
	}
	extra := map[string]bool{}
	for _, e := range c.opts.ExtraConf {
		extra[name(e)] = true
	}
	conf := []string{"-p " + strconv.Itoa(c.Port), "-k " + c.opts.Dir}
	for _, e := range settings {
		if !extra[name(e)] {
			conf = append(conf, "-c "+e)
		}
	}
	for _, e := range c.opts.ExtraConf {
		conf = append(conf, "-c "+e)
	}
	return strings.Join(conf, " ")
}

func (c *PGCluster) start(ctx context.Context) error {
	conf := c.serverOptions()
	logFile := c.logPath()
	// pg_ctl starts the server in a session of its own: killed midway (ctx
	// cancelled) it would leave the server running, unknown to Stop. So it
	// runs to its end whatever ctx does, and a server this start launched
	// for a caller that has gone, or left starting past -t, is stopped here
	// (never one that held the directory before: its postmaster.pid names
	// another process).
	before := c.postmasterPID()
	err := c.run(context.WithoutCancel(ctx), "pg_ctl", "-D", c.DataDir(), "-l", logFile, "-o", conf, "-w", "-t", "60", "start")
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		if pid := c.postmasterPID(); pid != 0 && pid != before {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			_ = c.run(sctx, "pg_ctl", "-D", c.DataDir(), "-m", "immediate", "-w", "-t", "60", "stop")
		}
		return fmt.Errorf("PostgreSQL did not start: %w; see %s", err, logFile)
	}
	return nil
}

// postmasterPID is the process postmaster.pid names, 0 when there is none.
func (c *PGCluster) postmasterPID() int {
	b, err := os.ReadFile(filepath.Join(c.DataDir(), "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// Stop shuts the server down cleanly (fast mode).
func (c *PGCluster) Stop() error { return c.stop("fast") }

// Crash stops the server without a checkpoint, as a power cut would.
func (c *PGCluster) Crash() error { return c.stop("immediate") }

func (c *PGCluster) stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.running {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	err := c.run(ctx, "pg_ctl", "-D", c.DataDir(), "-m", mode, "-w", "-t", "60", "stop")
	if err == nil {
		c.running = false
	}
	return err
}

// Restart stops the server in the given mode ("fast" or "immediate") and
// starts it again on the same port.
func (c *PGCluster) Restart(ctx context.Context, mode string) error {
	if err := c.stop(mode); err != nil {
		return err
	}
	return c.Start(ctx)
}

// URL is a connection URL for database db.
func (c *PGCluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// RoleURL is the URL of db for role (the cluster trusts loopback
// connections: no password).
func (c *PGCluster) RoleURL(role, db string) string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", role, c.Port, db)
}

// CreateRole creates a login role, neither superuser nor able to create
// databases or roles, unless it exists. role must be a plain lowercase
// identifier (it is not quoted).
func (c *PGCluster) CreateRole(ctx context.Context, role string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = $1)`, role).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	if _, err := conn.Exec(ctx, `CREATE ROLE `+role+` LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE`); err != nil {
		return fmt.Errorf("create role %s: %w", role, err)
	}
	return nil
}

// CreateDatabase creates db (optionally from a template) unless it exists.
func (c *PGCluster) CreateDatabase(ctx context.Context, db, template string) error {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", db).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	stmt := "CREATE DATABASE " + pgx.Identifier{db}.Sanitize()
	if template != "" {
		stmt += " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	}
	_, err = conn.Exec(ctx, stmt)
	return err
}

// BaseBackup takes a pg_basebackup of the running cluster into dest (which
// must not exist), owned by the server user so it can be started as a cluster.
// It asks for an immediate checkpoint: the default spread checkpoint would
// make it wait up to most of checkpoint_timeout on an idle cluster.
func (c *PGCluster) BaseBackup(ctx context.Context, dest string) error {
	return c.run(ctx, "pg_basebackup", "-D", dest, "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port), "-U", "postgres", "-X", "stream", "-c", "fast")
}

// Running reports whether the server was started and not stopped.
func (c *PGCluster) Running() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.running
}

// lastLine is the last non-empty line of a command's output: enough to
// say what failed on one line.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}
