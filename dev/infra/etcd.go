package infra

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
)

// EtcdNode is one member of an embedded etcd cluster.
type EtcdNode struct {
	Name      string
	Dir       string
	ClientURL string
	PeerURL   string

	mu      sync.Mutex
	cluster *EtcdCluster
	etcd    *embed.Etcd
}

// EtcdCluster is one or more embedded etcd members on loopback ports, in
// this process.
type EtcdCluster struct {
	Nodes   []*EtcdNode
	token   string
	initial string
}

// StartEtcd starts an embedded etcd cluster of n members (1 or 3 usually)
// with data under dir. An existing data dir is reused (a restart); ports
// are fixed by ports[] when given (2 per node: client, peer) or picked free.
func StartEtcd(ctx context.Context, dir string, n int, ports ...int) (*EtcdCluster, error) {
	if n < 1 {
		return nil, errors.New("localinfra: etcd cluster needs at least one member")
	}
	c := &EtcdCluster{token: "payouts-" + filepath.Base(dir)}
	var initial []string
	for i := 0; i < n; i++ {
		var cp, pp int
		if len(ports) >= 2*(i+1) {
			cp, pp = ports[2*i], ports[2*i+1]
		} else {
			var err error
			if cp, err = FreePort(); err != nil {
				return nil, err
			}
			if pp, err = FreePort(); err != nil {
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
	if err := os.MkdirAll(n.Dir, 0o700); err != nil {
		return err
	}
	cfg := embed.NewConfig()
	cfg.Name = n.Name
	cfg.Dir = n.Dir
	cu, _ := url.Parse(n.ClientURL)
	pu, _ := url.Parse(n.PeerURL)
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = n.cluster.initial
	cfg.InitialClusterToken = n.cluster.token
	cfg.LogLevel = "error"
	cfg.LogOutputs = []string{"stderr"}
	// Tighter timing than the defaults so elections finish quickly in tests
	// and demos; still well above loopback latency.
	cfg.TickMs = 50
	cfg.ElectionMs = 500
	// Keep one hour of history and compact the rest, so the lock service's
	// deleted grant records do not stay in etcd's keyspace forever.
	cfg.AutoCompactionMode = "periodic"
	cfg.AutoCompactionRetention = "1h"
	if _, err := os.Stat(filepath.Join(n.Dir, "member")); err == nil {
		cfg.ClusterState = embed.ClusterStateFlagExisting
	}
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return fmt.Errorf("localinfra: start etcd member %s: %w", n.Name, err)
	}
	n.etcd = e
	return nil
}

func (n *EtcdNode) waitReady(ctx context.Context) error {
	n.mu.Lock()
	e := n.etcd
	n.mu.Unlock()
	if e == nil {
		return fmt.Errorf("localinfra: etcd member %s is stopped", n.Name)
	}
	select {
	case <-e.Server.ReadyNotify():
		return nil
	case err := <-e.Err():
		return fmt.Errorf("localinfra: etcd member %s: %w", n.Name, err)
	case <-ctx.Done():
		return fmt.Errorf("localinfra: etcd member %s not ready: %w", n.Name, ctx.Err())
	case <-time.After(60 * time.Second):
		return fmt.Errorf("localinfra: etcd member %s not ready after 60s", n.Name)
	}
}

// Stop stops this member (its data stays; Restart brings it back).
func (n *EtcdNode) Stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.etcd == nil {
		return
	}
	n.etcd.Close()
	<-n.etcd.Server.StopNotify()
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
	return n.etcd.Server.Leader() == n.etcd.Server.MemberID() && n.etcd.Server.Leader() != 0
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
			return nil, fmt.Errorf("localinfra: no etcd leader: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// Client returns a client for all members.
func (c *EtcdCluster) Client() (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second})
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
