package etcdbackend

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/logutil"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/payouts/payouts/internal/loopback"
)

// Member describes one member of an etcd cluster run inside this process:
// `serve lock --etcd-embed-dir` (development) and the local stack and
// tests. Production runs etcd as its own cluster.
type Member struct {
	Name      string
	Dir       string // data directory
	ClientURL string // http://127.0.0.1:PORT
	PeerURL   string
	// InitialCluster lists every member as name=peerURL,...; empty means
	// this member alone.
	InitialCluster string
	ClusterToken   string
	// LogFile receives etcd's log as JSON lines (appended); empty discards
	// it. etcd's log never goes to the console of the process embedding it.
	LogFile string
	// LogLevel is the least severe level written to LogFile: the level the
	// embedding process was started with.
	LogLevel slog.Level
	// MaxTxnOps is etcd's --max-txn-ops, the most operations a
	// transaction may hold (0: etcd's default, 128). Tests lower it to
	// check that the backend splits what a cluster refuses.
	MaxTxnOps uint
}

// Embedded is a running embedded etcd member.
type Embedded struct {
	etcd     *embed.Etcd
	stopping *atomic.Bool
	logger   *zap.Logger
	closeLog func()
}

// StartMember starts one embedded member (an existing data directory is
// reused: a restart). It returns once the member is started, not ready;
// Ready waits for that.
func StartMember(m Member) (*Embedded, error) {
	if err := os.MkdirAll(m.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("etcd data dir: %w", err)
	}
	cu, err := url.Parse(m.ClientURL)
	if err != nil {
		return nil, fmt.Errorf("etcd client URL: %w", err)
	}
	pu, err := url.Parse(m.PeerURL)
	if err != nil {
		return nil, fmt.Errorf("etcd peer URL: %w", err)
	}
	stopping := &atomic.Bool{}
	lg, closeLog, err := memberLogger(m.LogFile, m.LogLevel, stopping)
	if err != nil {
		return nil, err
	}
	cfg := embed.NewConfig()
	cfg.Name = m.Name
	cfg.Dir = m.Dir
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = m.InitialCluster
	if cfg.InitialCluster == "" {
		cfg.InitialCluster = m.Name + "=" + m.PeerURL
	}
	if m.ClusterToken != "" {
		cfg.InitialClusterToken = m.ClusterToken
	}
	cfg.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	// Tighter timing than the defaults so elections finish quickly on a
	// development machine; still well above loopback latency.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	// Keep one hour of history and compact the rest, so the lock service's
	// deleted grant records do not stay in etcd's keyspace forever (an
	// external cluster needs the same: --auto-compaction-mode=periodic
	// --auto-compaction-retention=1h, docs/lock-service.md).
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	if m.MaxTxnOps > 0 {
		cfg.MaxTxnOps = m.MaxTxnOps
	}
	// A member that has written its log rejoins its cluster; etcd itself
	// tells them apart by the log, which it writes after member/ and its
	// snapshot directory. A member killed in between, during its first
	// start, starts as new again: taken for an existing one, it would ask
	// peers that never knew it, and never start.
	if hasWAL(filepath.Join(m.Dir, "member", "wal")) {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		closeLog()
		return nil, fmt.Errorf("start etcd member %s: %w", m.Name, err)
	}
	return &Embedded{etcd: e, stopping: stopping, logger: lg, closeLog: closeLog}, nil
}

// Ready waits until the member serves clients.
func (e *Embedded) Ready(ctx context.Context) error {
	select {
	case <-e.etcd.Server.ReadyNotify():
		return nil
	case err := <-e.etcd.Err():
		return fmt.Errorf("etcd member %s: %w", e.etcd.Config().Name, err)
	case <-ctx.Done():
		return fmt.Errorf("etcd member %s not ready: %w", e.etcd.Config().Name, ctx.Err())
	}
}

// IsLeader reports whether this member is the raft leader.
func (e *Embedded) IsLeader() bool {
	l := e.etcd.Server.Leader()
	return l != 0 && l == e.etcd.Server.MemberID()
}

// Close stops the member and waits until it has stopped. Its servers
// report their listeners closing as errors; on a stop that was asked for
// those are logged as what they are, the end of serving (see
// shutdownCore).
func (e *Embedded) Close() {
	e.stopping.Store(true)
	e.etcd.Close()
	<-e.etcd.Server.StopNotify()
	_ = e.logger.Sync()
	e.closeLog()
}

// memberLogger builds etcd's logger: JSON lines to path at level.
func memberLogger(path string, level slog.Level, stopping *atomic.Bool) (*zap.Logger, func(), error) {
	if path == "" {
		return zap.NewNop(), func() {}, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, nil, fmt.Errorf("etcd log dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("etcd log file: %w", err)
	}
	core := zapcore.NewCore(zapcore.NewJSONEncoder(logutil.DefaultZapLoggerConfig.EncoderConfig),
		zapcore.AddSync(f), zapLevel(level))
	lg := zap.New(&shutdownCore{Core: core, stopping: stopping}, zap.AddCaller(), zap.ErrorOutput(zapcore.AddSync(f)))
	return lg, func() { f.Close() }, nil
}

func zapLevel(l slog.Level) zapcore.Level {
	switch {
	case l < slog.LevelInfo:
		return zapcore.DebugLevel
	case l < slog.LevelWarn:
		return zapcore.InfoLevel
	case l < slog.LevelError:
		return zapcore.WarnLevel
	default:
		return zapcore.ErrorLevel
	}
}

// shutdownCore corrects the level of two kinds of etcd log entry that
// report no failure, so that a clean run leaves no error in the log:
//   - while the member is being stopped on purpose, a warning or error that
//     only reports a listener or server closing is written at info: etcd's
//     serving goroutines log their end as an error whatever the cause;
//   - a fresh member's first storage-version update fails while its first
//     raft term is not yet on disk ("missing term information"); etcd
//     retries it on its next tick, so it is written as a warning.
type shutdownCore struct {
	zapcore.Core
	stopping *atomic.Bool
}

func (c *shutdownCore) With(fields []zapcore.Field) zapcore.Core {
	return &shutdownCore{Core: c.Core.With(fields), stopping: c.stopping}
}

// Check lets warnings and errors through to Write, which decides their
// level; the wrapped core decides for everything else.
func (c *shutdownCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Core.Enabled(ent.Level) || (ent.Level >= zapcore.WarnLevel && ent.Level <= zapcore.ErrorLevel) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c *shutdownCore) Write(ent zapcore.Entry, fields []zapcore.Field) error {
	if ent.Level >= zapcore.WarnLevel && ent.Level <= zapcore.ErrorLevel {
		switch {
		case c.stopping.Load() && errorSays(fields, closedListener):
			ent.Level = zapcore.InfoLevel
		case ent.Message == "failed to update storage version" && errorSays(fields, missingTerm):
			ent.Level = zapcore.WarnLevel
		}
		if !c.Core.Enabled(ent.Level) {
			return nil
		}
	}
	return c.Core.Write(ent, fields)
}

// errorSays reports whether the entry's error field matches.
func errorSays(fields []zapcore.Field, match func(error) bool) bool {
	for _, f := range fields {
		if err, ok := f.Interface.(error); ok && f.Type == zapcore.ErrorType && match(err) {
			return true
		}
	}
	return false
}

// closedListener reports whether err is a server or listener closing.
func closedListener(err error) bool {
	return errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) ||
		strings.Contains(err.Error(), "use of closed network connection") ||
		strings.Contains(err.Error(), "server closed")
}

func missingTerm(err error) bool { return strings.Contains(err.Error(), "missing term information") }

// hasWAL reports whether dir holds a segment of etcd's write-ahead log.
func hasWAL(dir string) bool {
	names, err := os.ReadDir(dir)
	if err != nil {
		return false
	}
	for _, n := range names {
		if strings.HasSuffix(n.Name(), ".wal") {
			return true
		}
	}
	return false
}

// StartEmbedded runs the single-node etcd of `serve lock --etcd-embed-dir`:
// data in dir/etcd0, its log in dir/etcd.log at the process's level. Its
// ports are kept in dir/ports and reused on a restart when still free.
func StartEmbedded(ctx context.Context, dir string, level slog.Level) (*Embedded, []string, error) {
	portFile := filepath.Join(dir, "ports")
	var cp, pp int
	if b, err := os.ReadFile(portFile); err == nil {
		if _, err := fmt.Sscanf(string(b), "%d %d", &cp, &pp); err != nil || !loopback.PortFree(cp) || !loopback.PortFree(pp) {
			cp, pp = 0, 0
		}
	}
	var err error
	if cp == 0 {
		if cp, err = loopback.FreePort(); err != nil {
			return nil, nil, err
		}
		if pp, err = loopback.FreePort(); err != nil {
			return nil, nil, err
		}
	}
	client := fmt.Sprintf("http://127.0.0.1:%d", cp)
	e, err := StartMember(Member{Name: "etcd0", Dir: filepath.Join(dir, "etcd0"), ClientURL: client,
		PeerURL: fmt.Sprintf("http://127.0.0.1:%d", pp), ClusterToken: "payouts-" + filepath.Base(dir),
		LogFile: filepath.Join(dir, "etcd.log"), LogLevel: level})
	if err != nil {
		return nil, nil, fmt.Errorf("embedded etcd (log: %s): %w", filepath.Join(dir, "etcd.log"), err)
	}
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := e.Ready(rctx); err != nil {
		e.Close()
		return nil, nil, fmt.Errorf("embedded etcd (log: %s): %w", filepath.Join(dir, "etcd.log"), err)
	}
	_ = os.WriteFile(portFile, fmt.Appendf(nil, "%d %d\n", cp, pp), 0o600)
	return e, []string{client}, nil
}
