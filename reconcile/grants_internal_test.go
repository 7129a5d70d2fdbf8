package reconcile

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/payouts/payouts/lock/fencing"
)

// TestGrantIndexIsCompact: the grant index is the one part of a pass that
// grows with the history (a week of grants at the default retention can be
// tens of millions), so it holds a grant in a few machine words: 300,000
// grants of 5,000 keys and 20 sessions take at most 40 bytes each (maps of
// token to key and to session took about 120), and each token still finds
// its own key and session.
func TestGrantIndexIsCompact(t *testing.T) {
	const n = 300_000
	key := func(i int) string { return fmt.Sprintf("payout:acc-%06d", i%5000) }
	session := func(i int) string { return fmt.Sprint(7587890000000000000 + int64(i%20)) }
	token := func(i int) fencing.Token { return fencing.Token(2*i + 1) }
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g := newGrantIndex(nil, 0)
	for i := range n {
		g.add(token(i), key(i), session(i))
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if per := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / n; per > 40 {
		t.Errorf("the grant index holds %d grants in %.0f bytes each; want at most 40", n, per)
	}
	for _, i := range []int{0, 1, 4999, 5000, n / 2, n - 1} {
		if k, s, ok := g.find(token(i)); !ok || k != key(i) || s != session(i) {
			t.Errorf("token %d: %q %q %v; want %q %q", token(i), k, s, ok, key(i), session(i))
		}
	}
	if _, _, ok := g.find(token(n/2) + 1); ok {
		t.Errorf("token %d, never granted, found", token(n/2)+1)
	}
	runtime.KeepAlive(g)
}

// TestShortGrantRetentionStillChecks: the retention horizon leaves a
// clock-skew margin; a retention of an hour or less with the margin of an
// hour put the horizon at or after now, so no write was ever checked
// against the grant log (INV-07 off). A short retention keeps the newer
// half of its window checked.
func TestShortGrantRetentionStillChecks(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		retention time.Duration
		checked   time.Duration // writes younger than this are checked
	}{
		{7 * 24 * time.Hour, 7*24*time.Hour - GrantClockSkew},
		{2 * time.Hour, time.Hour},
		{time.Hour, 30 * time.Minute},
		{10 * time.Minute, 5 * time.Minute},
	} {
		g := newGrantIndex(nil, 0).withRetention(c.retention, now)
		if g.beyondRetention(now.Add(-c.checked+time.Second), "ledger") {
			t.Errorf("retention %s: a write %s old is not checked", c.retention, c.checked-time.Second)
		}
		if !g.beyondRetention(now.Add(-c.checked-time.Second), "ledger") {
			t.Errorf("retention %s: a write %s old is checked, though its grant may be gone", c.retention, c.checked+time.Second)
		}
	}
	if newGrantIndex(nil, 0).withRetention(0, now).beyondRetention(now.Add(-365*24*time.Hour), "ledger") {
		t.Error("without retention a write a year old is not checked")
	}
}
