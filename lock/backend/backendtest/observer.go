package backendtest

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/payouts/payouts/lock/backend"
)

// BatchRecorder is an observer that records the batch sizes a backend
// reports (StoreBatch), as "op:calls".
type BatchRecorder struct {
	backend.NopObserver
	mu   sync.Mutex
	seen []string
}

// StoreBatch implements backend.Observer.
func (r *BatchRecorder) StoreBatch(op string, calls int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, fmt.Sprintf("%s:%d", op, calls))
}

// String is the sizes in the order they were reported.
func (r *BatchRecorder) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.seen, " ")
}

// Sorted is the sizes in sorted order (for batches written concurrently).
func (r *BatchRecorder) Sorted() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(slices.Sorted(slices.Values(r.seen)), " ")
}
