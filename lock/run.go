package lock

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/internal/auth"
	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/obs"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/pgbackend"
)

// Config is `payouts serve lock`.
type Config struct {
	Backend       string // "etcd" or "postgres"
	Listen        string
	DatabaseURL   string   // postgres
	EtcdEndpoints []string // etcd
	EtcdEmbedDir  string   // etcd: run a single-node embedded etcd here
	EtcdPrefix    string
	// GrantRetention is how long ended grants are kept (0: forever).
	GrantRetention time.Duration
	Logger         *slog.Logger
	Registry       *prometheus.Registry
	Auth           *auth.Authenticator
	TLS            *tls.Config // serve HTTPS (nil: plain HTTP)
	// OnListen is told the bound address before serving (tests, dev up).
	OnListen func(net.Addr)
}

// CheckEtcdStore says what is wrong with the etcd an etcd backend is given:
// exactly one of endpoints and an embedded node's directory.
func CheckEtcdStore(endpoints []string, embedDir string) error {
	switch {
	case len(endpoints) == 0 && embedDir == "":
		return errors.New("--backend etcd needs --etcd-endpoints or --etcd-embed-dir")
	case len(endpoints) > 0 && embedDir != "":
		return errors.New("--etcd-endpoints and --etcd-embed-dir are mutually exclusive")
	}
	return nil
}

// OpenBackend opens the configured backend; the returned cleanup stops an
// embedded etcd.
func OpenBackend(ctx context.Context, cfg Config) (backend.Backend, func(), error) {
	switch cfg.Backend {
	case "postgres":
		if cfg.DatabaseURL == "" {
			return nil, nil, errors.New("--backend postgres needs --database-url")
		}
		b, err := pgbackend.Open(ctx, pgbackend.Config{DatabaseURL: cfg.DatabaseURL, Logger: cfg.Logger, GrantRetention: cfg.GrantRetention})
		return b, func() {}, err
	case "etcd":
		if err := CheckEtcdStore(cfg.EtcdEndpoints, cfg.EtcdEmbedDir); err != nil {
			return nil, nil, err
		}
		endpoints := cfg.EtcdEndpoints
		cleanup := func() {}
		if cfg.EtcdEmbedDir != "" {
			dir, err := filepath.Abs(cfg.EtcdEmbedDir)
			if err != nil {
				return nil, nil, err
			}
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return nil, nil, fmt.Errorf("etcd embed dir: %w", err)
			}
			e, eps, err := etcdbackend.StartEmbedded(ctx, dir, obs.LevelOf(cfg.Logger))
			if err != nil {
				return nil, nil, err
			}
			cfg.Logger.Warn("running an embedded single-node etcd (development only)", "dir", dir,
				"endpoints", strings.Join(eps, ","), "log", filepath.Join(dir, "etcd.log"))
			endpoints, cleanup = eps, e.Close
		}
		b, err := etcdbackend.Open(ctx, etcdbackend.Config{Endpoints: endpoints, Prefix: cfg.EtcdPrefix, Logger: cfg.Logger, GrantRetention: cfg.GrantRetention})
		if err != nil {
			cleanup()
			return nil, nil, err
		}
		return b, cleanup, nil
	}
	return nil, nil, errBackend(cfg.Backend)
}

// Run serves the lock service until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = obs.NewRegistry()
	}
	b, cleanup, err := OpenBackend(ctx, cfg)
	if err != nil {
		return err
	}
	defer cleanup()
	defer b.Close()
	srv := httpx.NewServer(httpx.Config{
		Role: "lock", Addr: cfg.Listen, Logger: cfg.Logger, Registry: cfg.Registry, Auth: cfg.Auth,
		RequestTimeout: backend.MaxWait + opTimeout + 5*time.Second,
		Ready:          []httpx.Check{b.Ping},
		TLS:            cfg.TLS,
	})
	svc := NewService(b, cfg.Registry, cfg.Logger)
	svc.Mount(srv.Router())
	addr, err := srv.Listen()
	if err != nil {
		return err
	}
	cfg.Logger.Info("lock service starting", "backend", b.Name(), "addr", addr.String())
	if cfg.OnListen != nil {
		cfg.OnListen(addr)
	}
	var g httpx.Group
	g.Add(srv.Serve)
	g.Add(b.Run)
	g.Add(func(ctx context.Context) error {
		<-ctx.Done() // draining: waiting acquires answer now
		svc.StopWaiting()
		return nil
	})
	return g.Run(ctx)
}
