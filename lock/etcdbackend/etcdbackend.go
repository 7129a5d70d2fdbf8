// Package etcdbackend is the lock service's etcd backend.
//
// A session is an etcd lease the service holds for its caller (session id
// = lease id, keepalive = KeepAliveOnce); a held lock is the key
// <prefix>/locks/<key> attached to that lease; the fencing token is that
// key's CreateRevision, which etcd makes cluster-wide monotonic (INV-04).
// Every grant writes its open marker <prefix>/open/<id>, which holds its
// record, in the acquiring transaction, so the marker's CreateRevision is the
// token too (D-9). The transaction that ends the grant (release, revoke,
// or the record of its lease's expiry) deletes the marker and writes the
// ended record <prefix>/grants/<token>, keyed by the token zero-padded to 20
// digits: the grant log in key order is the grant log in token order, so a
// page of it is one range read of that page's records, however long the log
// (an index etcd cannot otherwise give: it sorts by create revision only by
// reading the whole range). Expiry is etcd's decision; grants ended by it
// are recorded by watching the lock prefix.
package etcdbackend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	"github.com/payouts/payouts/internal/batcher"
	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
)

// DefaultPrefix is where the lock service keeps its keys.
const DefaultPrefix = "/payouts/lock"

// Config configures the backend.
type Config struct {
	// Client is an etcd client; Endpoints is used when it is nil (with
	// ClientConfig). A client made elsewhere should use ClientConfig too
	// (its DialOptions, and its DialKeepAliveTime and DialKeepAliveTimeout),
	// to reconnect promptly after an outage and to leave a member that
	// stopped answering.
	Client    *clientv3.Client
	Endpoints []string
	Prefix    string
	Logger    *slog.Logger
	// SweepInterval is how often open grants are checked against their
	// keys, to record expiries the watch missed (default 5s).
	SweepInterval time.Duration
	// GrantRetention is how long an ended grant record (and a session
	// record whose session has ended) is kept before compaction deletes it
	// (0: forever).
	GrantRetention time.Duration
	// CompactInterval is how often compaction runs (default 1 minute).
	CompactInterval time.Duration
	// StepTimeout bounds each step of Run's background work (a sweep, a
	// compaction pass, recording one watch answer, starting the watch)
	// and the backend's own calls that no caller waits for (default
	// DefaultStepTimeout).
	StepTimeout time.Duration
}

// reconnectBackoff is how the etcd client spaces its attempts to reconnect
// to an endpoint that stopped answering. gRPC's default (1s growing to
// 120s) leaves the client waiting up to about a minute after an outage of
// a minute or more, while every executor fails closed; capped at 2s, it
// is back within about 2s of etcd answering again.
var reconnectBackoff = backoff.Config{
	BaseDelay:  100 * time.Millisecond,
	Multiplier: 1.6,
	Jitter:     0.2,
	MaxDelay:   2 * time.Second,
}

// DialOptions are the gRPC options of every long-lived etcd client the
// lock service (and the local stack) creates: the capped reconnect
// backoff.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           reconnectBackoff,
		MinConnectTimeout: 5 * time.Second,
	})}
}

// keepAliveTime and keepAliveTimeout are the client's gRPC keepalive: a
// connection that has had streams open (calls, watches) and nothing from
// etcd for keepAliveTime is pinged, and closed when the ping is not
// answered within keepAliveTimeout. A member that stops answering with its
// connection still up (a frozen process: its kernel keeps the TCP
// connection) is then dropped within 15 s, its calls fail as unavailable,
// the watch moves to another member and later calls go to the others.
// gRPC answers pings itself, however busy etcd is: a live member answers
// in milliseconds. 10 s is the least gRPC allows, and at least etcd's
// --grpc-keepalive-min-time (5 s by default), under which etcd takes pings
// for abuse.
//
// PermitWithoutStream stays off: etcd's servers do not permit pings on a
// connection without streams (their enforcement policy), and answer the
// third with GOAWAY too_many_pings, dropping idle connections to live
// members. It is not needed to find a dead idle connection: a call that
// opens a stream on a connection idle for keepAliveTime is pinged for at
// once, so it fails after keepAliveTimeout (within 15 s in any case; a
// read is retried on another member, a write fails as unavailable).
const (
	keepAliveTime    = 10 * time.Second
	keepAliveTimeout = 5 * time.Second
)

// ClientConfig is the etcd client configuration the backend uses when
// given endpoints: a 5s dial timeout, no client logging, the keepalive
// (keepAliveTime), DialOptions.
func ClientConfig(endpoints []string) clientv3.Config {
	return clientv3.Config{
		Endpoints:            endpoints,
		DialTimeout:          5 * time.Second,
		DialKeepAliveTime:    keepAliveTime,
		DialKeepAliveTimeout: keepAliveTimeout,
		Logger:               zap.NewNop(),
		DialOptions:          DialOptions(),
	}
}

// Backend implements backend.Backend on etcd.
type Backend struct {
	cli     *clientv3.Client
	ownCli  bool
	prefix  string
	log     *slog.Logger
	sweepIv time.Duration
	// stepTimeout bounds each step of Run and the calls no caller waits
	// for (Config.StepTimeout).
	stepTimeout time.Duration
	cfg         Config

	watchCancel context.CancelFunc
	watchCh     clientv3.WatchChan

	mu       sync.Mutex
	observer backend.Observer
	waiters  backend.Waiters
	cache    cache
	waiting  waitingSet // acquires waiting on any process (waiting.go)
	// waitingRev is the revision Run's watch of the waiting markers starts
	// from: the one after Open read them.
	waitingRev int64
	unmarks    sync.WaitGroup // deletes of waiting markers in flight

	// Releases and revokes that arrive while others are in flight end
	// their grants together, in one transaction (endMany).
	ends *batcher.Batcher[endReq, endRes]
}

var _ backend.Backend = (*Backend)(nil)

// endOptions: one transaction ends at most expiryBatch grants (etcd's
// --max-txn-ops), and two such transactions may be in flight at once: at
// 32 clients that did 3-4 % more pairs a second than one, as etcd
// pipelines raft proposals. Each transaction's size goes to the observer
// (op release: releases and revokes). An end whose caller has gone away
// before a transaction took it is not made.
func endOptions(b *Backend) batcher.Options {
	return batcher.Options{MaxBatch: expiryBatch, Parallel: 2, DropAbandoned: true, Observe: func(calls int) { b.obs().StoreBatch("release", calls) }}
}

// Open connects (or uses cfg.Client), moves a grant log of the earlier
// layout to this one (migrate.go) and starts watching the lock prefix.
func Open(ctx context.Context, cfg Config) (*Backend, error) {
	if cfg.Prefix == "" {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CompactInterval <= 0 {
		cfg.CompactInterval = time.Minute
	}
	if cfg.SweepInterval <= 0 {
		cfg.SweepInterval = 5 * time.Second
	}
	if cfg.StepTimeout <= 0 {
		cfg.StepTimeout = DefaultStepTimeout
	}
	b := &Backend{cli: cfg.Client, cfg: cfg, prefix: strings.TrimRight(cfg.Prefix, "/"), log: cfg.Logger, sweepIv: cfg.SweepInterval,
		stepTimeout: cfg.StepTimeout, observer: backend.NopObserver{}}
	b.ends = batcher.New(b.endMany, endOptions(b))
	if b.cli == nil {
		if len(cfg.Endpoints) == 0 {
			return nil, errors.New("etcdbackend: no etcd endpoints")
		}
		cli, err := clientv3.New(ClientConfig(cfg.Endpoints))
		if err != nil {
			return nil, fmt.Errorf("etcdbackend: connect: %w", err)
		}
		b.cli, b.ownCli = cli, true
	}
	if err := b.firstPing(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("etcdbackend: %w", err)
	}
	if n, err := b.migrate(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("etcdbackend: %w", err)
	} else if n > 0 {
		b.log.Info("grant log moved to token-keyed records", "records", n)
	}
	if err := b.startWatch(ctx); err != nil {
		b.Close()
		return nil, fmt.Errorf("etcdbackend: watch: %w", err)
	}
	rev, err := b.readWaiting(ctx)
	if err != nil {
		b.Close()
		return nil, fmt.Errorf("etcdbackend: read waiting acquires: %w", err)
	}
	b.waitingRev = rev
	return b, nil
}

func (b *Backend) lockPath(key string) string   { return b.prefix + "/locks/" + key }
func (b *Backend) grantPath(token int64) string { return EndedGrantKey(b.prefix, token) }

// EndedGrantKey is the key of the ended grant record of token under prefix
// (tools that load a grant log, such as the reconcile benchmark, write it).
func EndedGrantKey(prefix string, token int64) string {
	return strings.TrimRight(prefix, "/") + "/grants/" + tokenKey(token)
}
func (b *Backend) openPath(id string) string    { return b.prefix + "/open/" + id }
func (b *Backend) sessionPath(id string) string { return b.prefix + "/sessions/" + id }
func (b *Backend) alivePath(id string) string   { return b.prefix + "/alive/" + id }

// lockValue is the value of a lock key: enough to write the grant's end
// without reading it first.
type lockValue struct {
	Owner     string    `json:"owner"`
	SessionID string    `json:"session_id"`
	GrantID   string    `json:"grant_id"`
	GrantedAt time.Time `json:"granted_at"`
}

// tokenKey is a token as the last segment of an ended grant record's key:
// zero-padded to 20 digits, so that keys sort as tokens do. A token is an
// int64, at most 19 digits: every such key starts with "0".
func tokenKey(token int64) string { return fmt.Sprintf("%020d", token) }

// parseTokenKey is tokenKey's inverse (false: not a token key).
func parseTokenKey(s string) (int64, bool) {
	if len(s) != 20 {
		return 0, false
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil && n > 0
}

// grantValue is a grant record: the value of an open grant's marker
// (whose CreateRevision is the token), or of an ended grant's record
// (whose key is the token).
type grantValue struct {
	Key       string     `json:"key"`
	Owner     string     `json:"owner"`
	SessionID string     `json:"session_id"`
	GrantedAt time.Time  `json:"granted_at"`
	EndedAt   *time.Time `json:"ended_at,omitempty"`
	EndReason string     `json:"end_reason,omitempty"`
	Actor     string     `json:"actor,omitempty"`
	Reason    string     `json:"reason,omitempty"`
}

// sessionValue is the session's record (not attached to the lease, so it
// outlives it and GET /sessions/{id} can say EXPIRED or CLOSED).
type sessionValue struct {
	Owner     string    `json:"owner"`
	Principal string    `json:"principal,omitempty"`
	TTLMS     int64     `json:"ttl_ms"`
	CreatedAt time.Time `json:"created_at"`
	Closed    bool      `json:"closed,omitempty"`
	// A closed session keeps its last heartbeat and the close as its
	// expiry, as lockdb does: the lease that held them is gone.
	LastHeartbeatAt time.Time `json:"last_heartbeat_at,omitzero"`
	ClosedAt        time.Time `json:"closed_at,omitzero"`
	// EndSeenAt is when compaction first found the session ended with no
	// end recorded: etcd keeps no time for a lease's expiry (nor did a
	// close before ClosedAt was written). Compaction deletes the record
	// once its end is older than the retention.
	EndSeenAt time.Time `json:"end_seen_at,omitzero"`
}

// end is when the ended session's record says it ended (zero: not known).
func (v sessionValue) end() time.Time {
	if v.Closed && !v.ClosedAt.IsZero() {
		return v.ClosedAt
	}
	return v.EndSeenAt
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are marshalled
	}
	return string(b)
}

// newID is a grant id, the key of its open marker: unique (nanoseconds,
// then randomness).
func newID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%016x", time.Now().UnixNano()) + hex.EncodeToString(b[:])
}

// Name implements backend.Backend.
func (b *Backend) Name() string { return "etcd" }

// SetObserver implements backend.Backend.
func (b *Backend) SetObserver(o backend.Observer) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.observer = o
}

func (b *Backend) obs() backend.Observer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.observer
}

// Ping implements backend.Backend: a linearizable read.
func (b *Backend) Ping(ctx context.Context) error {
	if _, err := b.cli.Get(ctx, b.prefix+"/ping", clientv3.WithCountOnly()); err != nil {
		return classify("ping", err)
	}
	return nil
}

// pingAttempt bounds one ping of firstPing: an etcd that does not answer
// holds a call until its deadline (the client waits for a connection).
const pingAttempt = 5 * time.Second

// firstPing waits for etcd to answer at start for at most the step
// timeout, a WARN line for each attempt it does not answer: an endpoint
// nothing listens on held the lock service before it listened, silent,
// until it was stopped, where the PostgreSQL backend exits at once. A
// cluster that comes up with the service (a compose file, a pod) gets the
// time to; one that does not is an error naming the endpoints.
func (b *Backend) firstPing(ctx context.Context) error {
	deadline := time.Now().Add(b.stepTimeout)
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithDeadline(ctx, minTime(deadline, time.Now().Add(pingAttempt)))
		err := b.Ping(actx)
		cancel()
		switch {
		case err == nil:
			return nil
		case ctx.Err() != nil:
			return err
		case !time.Now().Before(deadline):
			return fmt.Errorf("etcd at %s did not answer within %s (--etcd-endpoints): %w", strings.Join(b.cli.Endpoints(), ","), b.stepTimeout, err)
		}
		b.log.Warn("etcd does not answer yet: waiting for it before serving", "endpoints", strings.Join(b.cli.Endpoints(), ","), "attempt", attempt, "error", err.Error())
		if actx.Err() == nil { // it answered with an error at once: do not spin
			select {
			case <-ctx.Done():
				return err
			case <-time.After(time.Second):
			}
		}
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// Close implements backend.Backend.
func (b *Backend) Close() error {
	b.ends.Wait()    // ends in flight get their answers before the client goes
	b.unmarks.Wait() // and waiting markers being deleted are
	if b.watchCancel != nil {
		b.watchCancel()
	}
	if b.ownCli {
		return b.cli.Close()
	}
	return nil
}

func classify(what string, err error) error {
	if err == nil {
		return nil
	}
	var p *problem.Error
	if errors.As(err, &p) {
		return p
	}
	return backend.Unavailable(what, err)
}

// parseSessionID is the lease of session id, given in its one spelling
// (sessionID): "0N" or "+N" names no session, so that no request reaches
// session N's lease under an id whose session record (and owner) does not
// exist.
func parseSessionID(id string) (clientv3.LeaseID, bool) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil || n <= 0 || sessionID(clientv3.LeaseID(n)) != id {
		return 0, false
	}
	return clientv3.LeaseID(n), true
}

func sessionID(l clientv3.LeaseID) string { return strconv.FormatInt(int64(l), 10) }
