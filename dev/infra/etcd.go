package infra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/payouts/payouts/lock/etcdbackend"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// EtcdNode is one member of an embedded etcd cluster.
type EtcdNode struct {
	Name      string
	Dir       string
	ClientURL string
	PeerURL   string

	mu      sync.Mutex
	cluster *EtcdCluster
	etcd    *etcdbackend.Embedded
}

// EtcdCluster is one or more embedded etcd members on loopback ports, in
// this process.
type EtcdCluster struct {
	Nodes   []*EtcdNode
	token   string
	initial string
	opts    EtcdOptions
}

// EtcdOptions configures an embedded etcd cluster.
type EtcdOptions struct {
	Dir   string // data of member i in Dir/etcd<i>
	Nodes int    // members (default 1)
	// Ports fixes the ports, two per member (client, peer); missing ones
	// are picked free.
	Ports []int
	// LogFile receives every member's log (default Dir/etcd.log), at
	// LogLevel (default warn).
	LogFile  string
	LogLevel slog.Level
}

// StartEtcd starts an embedded etcd cluster of n members (1 or 3 usually)
// with data under dir and its log in dir/etcd.log. An existing data dir is
// reused (a restart); ports are fixed by ports[] when given (2 per node:
// client, peer) or picked free.
func StartEtcd(ctx context.Context, dir string, n int, ports ...int) (*EtcdCluster, error) {
	return StartEtcdCluster(ctx, EtcdOptions{Dir: dir, Nodes: n, Ports: ports, LogLevel: slog.LevelWarn})
}

// portAttempts bounds how often a new cluster whose ports were picked
// free is started again on fresh ports because another process bound one
// of them between the pick and etcd's listen.
const portAttempts = 5

// pickPort picks a member's port when none is given (tests replace it).
var pickPort = FreePort

// StartEtcdCluster starts an embedded etcd cluster as opts say.
func StartEtcdCluster(ctx context.Context, opts EtcdOptions) (*EtcdCluster, error) {
	fresh := len(opts.Ports) == 0
	for i := 0; i < max(opts.Nodes, 1) && fresh; i++ {
		if _, err := os.Stat(filepath.Join(opts.Dir, fmt.Sprintf("etcd%d", i))); err == nil {
			fresh = false // a restart keeps its members' addresses
		}
	}
	for attempt := 1; ; attempt++ {
		c, err := startEtcdCluster(ctx, opts)
		if err == nil || !fresh || attempt == portAttempts || !strings.Contains(err.Error(), "address already in use") {
			return c, err
		}
		for i := 0; i < max(opts.Nodes, 1); i++ {
			_ = os.RemoveAll(filepath.Join(opts.Dir, fmt.Sprintf("etcd%d", i)))
		}
	}
}

func startEtcdCluster(ctx context.Context, opts EtcdOptions) (*EtcdCluster, error) {
	dir, n, ports := opts.Dir, opts.Nodes, opts.Ports
	if n == 0 {
		n = 1
	}
	if n < 1 {
		return nil, errors.New("infra: etcd cluster needs at least one member")
	}
	if opts.LogFile == "" {
		opts.LogFile = filepath.Join(dir, "etcd.log")
	}
	c := &EtcdCluster{token: "payouts-" + filepath.Base(dir), opts: opts}
	var initial []string
	for i := 0; i < n; i++ {
		var cp, pp int
		if len(ports) >= 2*(i+1) {
			cp, pp = ports[2*i], ports[2*i+1]
		} else {
			var err error
			if cp, err = pickPort(); err != nil {
				return nil, err
			}
			if pp, err = pickPort(); err != nil {
				return nil, err
			}
		}
		node := &EtcdNode{
			Name:      fmt.Sprintf("etcd%d", i),
			Dir:       filepath.Join(dir, fmt.Sprintf("etcd%d", i)),
			ClientURL: fmt.Sprintf("http://127.0.0.1:%d", cp),
			PeerURL:   fmt.Sprintf("http://127.0.0.1:%d", pp),
			cluster:   c,
		}
		c.Nodes = append(c.Nodes, node)
		initial = append(initial, node.Name+"="+node.PeerURL)
	}
	c.initial = strings.Join(initial, ",")
	errs := make(chan error, n)
	for _, node := range c.Nodes {
		go func(node *EtcdNode) { errs <- node.start() }(node)
	}
	var firstErr error
	for range c.Nodes {
		if err := <-errs; err != nil && firstErr == nil {
			firstErr = err
		}
	}
	if firstErr != nil {
		c.Close()
		return nil, firstErr
	}
	for _, node := range c.Nodes {
		if err := node.waitReady(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

func (n *EtcdNode) start() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.etcd != nil {
		return nil
	}
	e, err := etcdbackend.StartMember(etcdbackend.Member{Name: n.Name, Dir: n.Dir, ClientURL: n.ClientURL, PeerURL: n.PeerURL,
		InitialCluster: n.cluster.initial, ClusterToken: n.cluster.token, LogFile: n.cluster.opts.LogFile, LogLevel: n.cluster.opts.LogLevel})
	if err != nil {
		return fmt.Errorf("infra: %w (log: %s)", err, n.cluster.opts.LogFile)
	}
	n.etcd = e
	return nil
}

func (n *EtcdNode) waitReady(ctx context.Context) error {
	n.mu.Lock()
	e := n.etcd
	n.mu.Unlock()
	if e == nil {
		return fmt.Errorf("infra: etcd member %s is stopped", n.Name)
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := e.Ready(ctx); err != nil {
		return fmt.Errorf("infra: %w (log: %s)", err, n.cluster.opts.LogFile)
	}
	return nil
}

// Stop stops this member (its data stays; Restart brings it back).
func (n *EtcdNode) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.etcd == nil {
		return
	}
	n.etcd.Close()
	n.etcd = nil
}

// Restart starts a stopped member again.
func (n *EtcdNode) Restart(ctx context.Context) error {
	if err := n.start(); err != nil {
		return err
	}
	return n.waitReady(ctx)
}

// Running reports whether this member is started.
func (n *EtcdNode) Running() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.etcd != nil
}

// IsLeader reports whether this running member is the raft leader.
func (n *EtcdNode) IsLeader() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.etcd == nil {
		return false
	}
	return n.etcd.IsLeader()
}

// Endpoints lists the client URLs of every member.
func (c *EtcdCluster) Endpoints() []string {
	var out []string
	for _, n := range c.Nodes {
		out = append(out, n.ClientURL)
	}
	return out
}

// Leader returns the current leader, waiting up to ctx for one to be elected.
func (c *EtcdCluster) Leader(ctx context.Context) (*EtcdNode, error) {
	for {
		for _, n := range c.Nodes {
			if n.IsLeader() {
				return n, nil
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("infra: no etcd leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Client returns a client for all members.
func (c *EtcdCluster) Client() (*clientv3.Client, error) {
	return clientv3.New(etcdbackend.ClientConfig(c.Endpoints()))
}

// Close stops every member.
func (c *EtcdCluster) Close() {
	var wg sync.WaitGroup
	for _, n := range c.Nodes {
		wg.Add(1)
		go func(n *EtcdNode) { defer wg.Done(); n.Stop() }(n)
	}
	wg.Wait()
}
