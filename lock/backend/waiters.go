package backend

import "sync"

// Waiters is the per-key registry of local waiting acquires that both
// backends keep: Changed subscribes, Signal wakes every subscriber of a key
// (a best-effort hint; waiters also retry on a timer).
type Waiters struct {
	mu    sync.Mutex
	byKey map[string]map[chan struct{}]struct{}
}

// Changed returns a channel signalled when key may have become free, and a
// function to unsubscribe.
func (w *Waiters) Changed(key string) (<-chan struct{}, func()) {
	ch := make(chan struct{}, 1)
	w.mu.Lock()
	if w.byKey == nil {
		w.byKey = map[string]map[chan struct{}]struct{}{}
	}
	if w.byKey[key] == nil {
		w.byKey[key] = map[chan struct{}]struct{}{}
	}
	w.byKey[key][ch] = struct{}{}
	w.mu.Unlock()
	return ch, func() {
		w.mu.Lock()
		delete(w.byKey[key], ch)
		if len(w.byKey[key]) == 0 {
			delete(w.byKey, key)
		}
		w.mu.Unlock()
	}
}

// Signal wakes every waiter of key without blocking.
func (w *Waiters) Signal(key string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for ch := range w.byKey[key] {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}

// Has reports whether anyone waits for key on this process.
func (w *Waiters) Has(key string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.byKey[key]) > 0
}
