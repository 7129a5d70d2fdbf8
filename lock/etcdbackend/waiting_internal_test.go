package etcdbackend

import (
	"testing"
	"time"
)

// A waiting marker counts until the time it carries: one whose delete was
// lost (it stays while its session lives) stops delaying the key's ends
// then. A marker without a readable time counts for the longest wait.
func TestAWaitingMarkerCountsUntilItsTime(t *testing.T) {
	w := waitingSet{byKey: map[string]map[string]time.Time{}}
	at := func(d time.Duration) []byte { return []byte(time.Now().Add(d).UTC().Format(time.RFC3339Nano)) }
	w.set("payout:a", "1", at(time.Minute), true)
	w.set("payout:b", "2", at(-time.Second), true)
	w.set("payout:c", "3", []byte(""), true)
	if !w.has("payout:a") || w.has("payout:b") || !w.has("payout:c") {
		t.Fatalf("has a, b, c = %v %v %v; want true false true", w.has("payout:a"), w.has("payout:b"), w.has("payout:c"))
	}
	w.set("payout:a", "1", nil, false)
	if w.has("payout:a") || len(w.byKey) != 2 {
		t.Fatalf("a deleted marker still counts: %v", w.byKey)
	}
}
