package lock

import (
	"sync"
	"time"
)

// owners remembers the principal that owns each session this process has
// seen. A session's principal never changes, so a remembered answer stays
// true and ownership costs no store round trip after the first; entries
// unused for longer than the longest TTL are dropped (such a session has
// expired, and is looked up again if it is ever named).
type owners struct {
	mu      sync.Mutex
	m       map[string]ownerEntry
	pruneAt int
}

type ownerEntry struct {
	principal string
	used      int64 // unix nanoseconds
}

const ownersMinPrune = 1024

func (o *owners) get(id string) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.m[id]
	if ok {
		e.used = time.Now().UnixNano()
		o.m[id] = e
	}
	return e.principal, ok
}

func (o *owners) put(id, principal string) {
	now := time.Now().UnixNano()
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]ownerEntry{}
	}
	o.m[id] = ownerEntry{principal: principal, used: now}
	if len(o.m) >= max(o.pruneAt, ownersMinPrune) {
		stale := now - int64(maxSessionTTL)
		for k, e := range o.m {
			if e.used < stale {
				delete(o.m, k)
			}
		}
		o.pruneAt = 2 * len(o.m)
	}
}

func (o *owners) forget(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, id)
}
