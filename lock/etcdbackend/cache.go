package etcdbackend

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/payouts/payouts/lock/backend"
)

// What the service already knows, so that it is not asked of etcd again:
// each session's record (immutable but for closing) and when this process
// last renewed it; and each held key's grant, as this process made it or
// the watch reported it. Both only shape the compares of a transaction
// (which etcd checks) or inform (server_expiry): a stale entry makes a
// transaction fail and the slow path run, never a wrong answer.

// sessInfo is a session as this process knows it.
type sessInfo struct {
	owner, principal string
	createdAt        time.Time
	ttl              time.Duration
	renewed          time.Time // when this process last saw the lease renewed (or granted)
}

// heldLock is the current grant of a key, enough to end it in one
// transaction.
type heldLock struct {
	token int64
	lease clientv3.LeaseID
	lv    lockValue
}

type cache struct {
	mu       sync.Mutex
	sessions map[string]*sessInfo
	held     map[string]heldLock
	pruneAt  int

	ends        map[int64]*ending // by token
	endsPruneAt int
}

const cacheMinPrune = 1024

func (c *cache) session(id string) (sessInfo, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.sessions[id]
	if !ok {
		return sessInfo{}, false
	}
	return *s, true
}

func (c *cache) putSession(id string, s sessInfo) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sessions == nil {
		c.sessions = map[string]*sessInfo{}
	}
	c.sessions[id] = &s
	if len(c.sessions) >= max(c.pruneAt, cacheMinPrune) {
		// A session not renewed through this process for longer than the
		// longest TTL is expired, or renewed elsewhere: read it again if
		// it is ever named.
		stale := time.Now().Add(-backend.MaxTTL - time.Minute)
		for k, v := range c.sessions {
			if v.renewed.Before(stale) {
				delete(c.sessions, k)
			}
		}
		c.pruneAt = 2 * len(c.sessions)
	}
}

func (c *cache) renewed(id string, at time.Time, ttl time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s, ok := c.sessions[id]; ok {
		s.renewed, s.ttl = at, ttl
	}
}

func (c *cache) forgetSession(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.sessions, id)
}

func (c *cache) lock(key string) (heldLock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.held[key]
	return h, ok
}

func (c *cache) putLock(key string, h heldLock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held == nil {
		c.held = map[string]heldLock{}
	}
	if cur, ok := c.held[key]; !ok || cur.token <= h.token {
		c.held[key] = h
	}
}

// forgetLock drops key's entry if it is the grant with token (0: any).
func (c *cache) forgetLock(key string, token int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h, ok := c.held[key]; ok && (token == 0 || h.token == token) {
		delete(c.held, key)
	}
}

// An end this process is making or has made: the watch sees the deletion
// of the lock key as it sees a lease's expiry, and need not ask etcd about
// a deletion this process's own transaction made.
type ending struct {
	done  chan struct{} // closed when the transaction has answered
	rev   int64         // the revision it deleted the key at; 0: it did not
	begun time.Time
}

// endingWait bounds how long the watch waits, per watch answer, for the
// answers of this process's own transactions whose effect it saw; past it,
// it reads as it would for any other deletion.
const endingWait = time.Second

// beginEnd registers an end of the grant with token about to be tried, and
// returns the function that records its outcome (rev 0: no deletion). A
// second end of the same grant while one is in flight is not registered.
func (c *cache) beginEnd(token int64) func(rev int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.ends[token]; ok {
		return func(int64) {}
	}
	if c.ends == nil {
		c.ends = map[int64]*ending{}
	}
	e := &ending{done: make(chan struct{}), begun: time.Now()}
	c.ends[token] = e
	if len(c.ends) >= max(c.endsPruneAt, cacheMinPrune) {
		// Ends the watch never came for (it was down, or the end did not
		// delete the key): nothing will ask for them.
		stale := time.Now().Add(-time.Minute)
		for k, v := range c.ends {
			if v.begun.Before(stale) {
				delete(c.ends, k)
			}
		}
		c.endsPruneAt = 2 * len(c.ends)
	}
	return func(rev int64) {
		c.mu.Lock()
		e.rev = rev
		if rev == 0 && c.ends[token] == e {
			delete(c.ends, token)
		}
		c.mu.Unlock()
		close(e.done)
	}
}

// endedHere reports whether this process's own transaction deleted the
// lock key of the grant with token at revision rev, waiting (until
// deadline, or ctx's end) for one in flight to answer. The entry is
// consumed.
func (c *cache) endedHere(ctx context.Context, token, rev int64, deadline time.Time) bool {
	c.mu.Lock()
	e, ok := c.ends[token]
	c.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case <-e.done:
	default:
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		select {
		case <-e.done:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ends[token] == e {
		delete(c.ends, token)
	}
	return e.rev == rev
}
