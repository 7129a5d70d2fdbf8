package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/payouts/payouts/dev/infra"
	"github.com/payouts/payouts/internal/pgpool"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/etcdbackend"
	"github.com/payouts/payouts/lock/pgbackend"
	"github.com/payouts/payouts/migrations"
)

func runID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// cleanups runs its functions in reverse order.
type cleanups []func()

func (c cleanups) run() {
	for i := len(c) - 1; i >= 0; i-- {
		c[i]()
	}
}

// withService starts the lock service on b and completes t around it.
func withService(ctx context.Context, t *target, b backend.Backend, log *slog.Logger, done cleanups) (*target, error) {
	svc, err := startService(ctx, b, log)
	if err != nil {
		done.run()
		return nil, err
	}
	done = append(done, svc.stop)
	t.service = &serviceSystem{url: svc.url}
	t.memory = func(ctx context.Context, n int) (float64, error) { return heapPerSession(ctx, svc.url, n) }
	t.close = done.run
	return t, nil
}

func etcdTarget(ctx context.Context, o LockOptions, log *slog.Logger) (*target, error) {
	var done cleanups
	endpoints := o.EtcdEndpoints
	if len(endpoints) == 0 {
		c, err := infra.StartEtcd(ctx, filepath.Join(o.Dir, "etcd"), 1)
		if err != nil {
			return nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		done = append(done, c.Close)
		endpoints = c.Endpoints()
	}
	newClient := func() (*clientv3.Client, error) {
		return clientv3.New(etcdbackend.ClientConfig(endpoints))
	}
	cli, err := newClient()
	if err != nil {
		done.run()
		return nil, err
	}
	done = append(done, func() { cli.Close() })
	base, err := newClient()
	if err != nil {
		done.run()
		return nil, err
	}
	done = append(done, func() { base.Close() })
	prefix := "/payouts-bench/" + runID()
	b, err := etcdbackend.Open(ctx, etcdbackend.Config{Client: cli, Prefix: prefix + "/service", Logger: log})
	if err != nil {
		done.run()
		return nil, err
	}
	done = append(done, func() { b.Close() })
	t := &target{baseline: &mutexSystem{cli: base, prefix: prefix + "/mutex/"}, baselineName: "etcd concurrency.Mutex"}
	return withService(ctx, t, b, log, done)
}

// mutexSystem is the etcd baseline: concurrency.Mutex lock and unlock, one
// session (lease) per client, on the same etcd.
type mutexSystem struct {
	cli      *clientv3.Client
	prefix   string
	sessions []*concurrency.Session
	mutexes  []*concurrency.Mutex
}

func (m *mutexSystem) prepare(ctx context.Context, clients int) error {
	for i := range clients {
		s, err := concurrency.NewSession(m.cli, concurrency.WithTTL(30), concurrency.WithContext(context.WithoutCancel(ctx)))
		if err != nil {
			return err
		}
		m.sessions = append(m.sessions, s)
		m.mutexes = append(m.mutexes, concurrency.NewMutex(s, fmt.Sprintf("%s%d", m.prefix, i)))
	}
	return nil
}

func (m *mutexSystem) pair(ctx context.Context, c int) (time.Duration, error) {
	start := time.Now()
	if err := m.mutexes[c].Lock(ctx); err != nil {
		return 0, err
	}
	lat := time.Since(start)
	return lat, m.mutexes[c].Unlock(ctx)
}

func (m *mutexSystem) finish(ctx context.Context) error {
	var errs []error
	for _, s := range m.sessions {
		errs = append(errs, s.Close())
	}
	_, err := m.cli.Delete(ctx, m.prefix, clientv3.WithPrefix())
	return errors.Join(append(errs, err)...)
}

func postgresTarget(ctx context.Context, o LockOptions, log *slog.Logger) (*target, error) {
	var done cleanups
	url := o.DatabaseURL
	if url == "" {
		// Durability on, as in production: a grant is answered only once
		// its commit is on disk.
		pg, err := infra.NewPGCluster(infra.PGOptions{Dir: filepath.Join(o.Dir, "pg"), Fsync: true})
		if err != nil {
			return nil, err
		}
		if err := pg.Start(ctx); err != nil {
			return nil, fmt.Errorf("start PostgreSQL: %w", err)
		}
		done = append(done, func() { _ = pg.Stop() })
		if err := pg.CreateDatabase(ctx, "lockdb", ""); err != nil {
			done.run()
			return nil, err
		}
		url = pg.URL("lockdb")
		if err := migrations.Apply(ctx, migrations.LockDB, url); err != nil {
			done.run()
			return nil, err
		}
	}
	b, err := pgbackend.Open(ctx, pgbackend.Config{DatabaseURL: url, Logger: log})
	if err != nil {
		done.run()
		return nil, err
	}
	done = append(done, func() { b.Close() })
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		done.run()
		return nil, err
	}
	pc.MaxConns = b.MaxConns()
	maps.Copy(pc.ConnConfig.RuntimeParams, pgpool.DurableCommits())
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		done.run()
		return nil, err
	}
	done = append(done, pool.Close)
	t := &target{baseline: &sqlSystem{pool: pool, table: "bench_lock_" + runID()}, baselineName: "postgres conditional insert+delete"}
	return withService(ctx, t, b, log, done)
}

// sqlSystem is the PostgreSQL baseline: the conditional insert that takes a
// free key with a token from a sequence, and the compare-and-delete that
// frees it, each one statement, with a pool as large as the backend's.
type sqlSystem struct {
	pool  *pgxpool.Pool
	table string
}

func (s *sqlSystem) prepare(ctx context.Context, clients int) error {
	_, err := s.pool.Exec(ctx, `CREATE TABLE `+s.table+` (key text PRIMARY KEY, token bigint NOT NULL);
		CREATE SEQUENCE `+s.table+`_seq`)
	return err
}

func (s *sqlSystem) pair(ctx context.Context, c int) (time.Duration, error) {
	key := fmt.Sprintf("bench:%d", c)
	start := time.Now()
	var token int64
	err := s.pool.QueryRow(ctx, `INSERT INTO `+s.table+` (key, token) VALUES ($1, nextval('`+s.table+`_seq'))
		ON CONFLICT (key) DO NOTHING RETURNING token`, key).Scan(&token)
	lat := time.Since(start)
	if err != nil {
		return lat, fmt.Errorf("baseline insert: %w", err)
	}
	tag, err := s.pool.Exec(ctx, `DELETE FROM `+s.table+` WHERE key = $1 AND token = $2`, key, token)
	if err == nil && tag.RowsAffected() != 1 {
		err = errors.New("baseline delete removed nothing")
	}
	return lat, err
}

func (s *sqlSystem) finish(ctx context.Context) error {
	_, err := s.pool.Exec(ctx, `DROP TABLE `+s.table+`; DROP SEQUENCE `+s.table+`_seq`)
	return err
}
