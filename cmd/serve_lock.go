package cmd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/payouts/payouts/lock"
	lockbackend "github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/migrations"
)

func newServeLockCmd(a *app) *cobra.Command {
	var (
		f         serverFlags
		backend   string
		endpoints string
		embedDir  string
		prefix    string
		retention time.Duration
	)
	c := &cobra.Command{
		Use:   "lock",
		Short: "Run the lock service (sessions, leases, fencing tokens) on etcd or PostgreSQL",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkLockBackend(backend); err != nil {
				return err
			}
			if err := checkBackendFlags(cmd, backend); err != nil {
				return err
			}
			if err := checkNonNegativeDurations(cmd, "grant-retention"); err != nil {
				return err
			}
			var eps []string
			for _, e := range strings.Split(endpoints, ",") {
				if e = strings.TrimSpace(e); e != "" {
					eps = append(eps, e)
				}
			}
			if backend == "etcd" {
				if ep, dir := givenAs(cmd, "etcd-endpoints"), givenAs(cmd, "etcd-embed-dir"); len(eps) > 0 && embedDir != "" && ep != "" && dir != "" {
					// Named as given: one may be a variable of the environment.
					return &ExitError{Code: 2, Err: fmt.Errorf("%s and %s are mutually exclusive: give one of them", ep, dir)}
				}
				if err := lock.CheckEtcdStore(eps, embedDir); err != nil {
					return &ExitError{Code: 2, Err: err}
				}
				for _, e := range eps {
					if err := checkEtcdEndpoint(e); err != nil {
						return &ExitError{Code: 2, Err: fmt.Errorf("%s: %w", givenAs(cmd, "etcd-endpoints"), err)}
					}
				}
			}
			f.db = "" // etcd: no database, --database-url is not read
			if backend == "postgres" {
				f.db = migrations.LockDB
			}
			env, err := f.setup(cmd, a)
			if err != nil {
				return err
			}
			cfg := lock.Config{
				Backend: backend, Listen: f.listen, DatabaseURL: env.DatabaseURL,
				EtcdEndpoints: eps, EtcdEmbedDir: embedDir, EtcdPrefix: prefix, GrantRetention: retention,
				Logger: env.Logger, Registry: env.Registry, Auth: env.Auth, TLS: env.TLS,
			}
			return env.run(cmd.Context(), func(ctx context.Context) error { return lock.Run(ctx, cfg) })
		},
	}
	f.register(c, "lock", "127.0.0.1:7101", migrations.LockDB)
	c.Flags().StringVar(&backend, "backend", "", "lock store: etcd or postgres (required)")
	c.Flags().StringVar(&endpoints, "etcd-endpoints", "", "etcd client URLs, comma-separated (--backend etcd)")
	c.Flags().StringVar(&embedDir, "etcd-embed-dir", "", "run a single-node embedded etcd with data in DIR (development; --backend etcd)")
	c.Flags().StringVar(&prefix, "etcd-prefix", etcdbackend.DefaultPrefix, "etcd key prefix of the lock service (--backend etcd)")
	c.Flags().DurationVar(&retention, "grant-retention", lockbackend.DefaultGrantRetention, "how long ended grants stay in the grant log before compaction deletes them (0: forever); payouts reconcile --grant-retention must not exceed it")
	return c
}

// backendFlags are the flags only one backend reads.
var backendFlags = map[string][]string{
	"etcd":     {"etcd-endpoints", "etcd-embed-dir", "etcd-prefix"},
	"postgres": {"database-url", "database-url-file", "migrate"},
}

// checkBackendFlags refuses a flag of the other backend (given on the
// command line or in the environment): it would be ignored without a
// word, so `--backend postgres --etcd-embed-dir X` did not run the etcd it
// seemed to ask for.
func checkBackendFlags(c *cobra.Command, backend string) error {
	for other, names := range backendFlags {
		if other == backend {
			continue
		}
		for _, name := range names {
			if as := givenAs(c, name); as != "" {
				return &ExitError{Code: 2, Err: fmt.Errorf("%s is for --backend %s: --backend %s does not read it", as, other, backend)}
			}
		}
	}
	return nil
}

// checkLockBackend refuses a --backend the lock service has no store for,
// naming the flag as required when it was not given.
func checkLockBackend(v string) error {
	switch v {
	case "etcd", "postgres":
		return nil
	case "":
		return &ExitError{Code: 2, Err: errors.New("--backend is required: etcd or postgres")}
	}
	return &ExitError{Code: 2, Err: fmt.Errorf("--backend must be etcd or postgres, got %q", v)}
}

// checkEtcdEndpoint refuses an endpoint the etcd client cannot dial: it
// took `bogus` and the lock service waited for it for ever. An endpoint is
// host:port or http(s)://host:port.
func checkEtcdEndpoint(e string) error {
	hostPort := e
	if scheme, rest, ok := strings.Cut(e, "://"); ok {
		u, err := url.Parse(e)
		if err != nil || (scheme != "http" && scheme != "https") || u.User != nil || u.RawQuery != "" || (u.Path != "" && u.Path != "/") || !strings.HasPrefix(rest, u.Host) {
			return fmt.Errorf("endpoint %q must be host:port or http(s)://host:port", e)
		}
		hostPort = u.Host
	}
	host, port, err := net.SplitHostPort(hostPort)
	if n, perr := strconv.Atoi(port); err != nil || host == "" || perr != nil || n < 1 || n > 65535 {
		return fmt.Errorf("endpoint %q must be host:port or http(s)://host:port", e)
	}
	return nil
}
