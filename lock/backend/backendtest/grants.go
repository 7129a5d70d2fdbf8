package backendtest

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/lock/backend"
	"github.com/payouts/payouts/lock/fencing"
)

func testTokensIncrease(t *testing.T, st Store) {
	b := st.Open(t)
	var sessions []backend.Session
	for i := range 3 {
		sessions = append(sessions, session(t, b, fmt.Sprintf("owner-%d", i), 30*time.Second))
	}
	var last fencing.Token
	for round := range 10 {
		for i, s := range sessions {
			key := fmt.Sprintf("payout:acc-%d", (round+i)%2)
			g, err := b.Acquire(ctx(t), key, s.ID)
			if problem.Has(err, problem.LockHeld) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if g.Token <= last {
				t.Fatalf("token %d issued after %d", g.Token, last)
			}
			last = g.Token
			if _, err := b.Release(ctx(t), key, s.ID, g.Token); err != nil {
				t.Fatalf("release: %v", err)
			}
		}
	}
	if last == 0 {
		t.Fatal("no grant was made")
	}
}

// testContention has many sessions race for one key. Whenever a grant's
// acquire started after another grant's release had returned, its token
// must be higher: tokens increase in the order grants are made, not merely
// in the order they were drawn.
func testContention(t *testing.T, st Store) {
	b := st.Open(t)
	type span struct {
		token            fencing.Token
		acqCall, relDone time.Time
	}
	var (
		mu    sync.Mutex
		spans []span
		wg    sync.WaitGroup
	)
	const workers, rounds = 8, 40
	for w := range workers {
		s := session(t, b, fmt.Sprintf("racer-%d", w), 60*time.Second)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				call := time.Now()
				g, err := b.Acquire(ctx(t), "payout:hot", s.ID)
				if problem.Has(err, problem.LockHeld) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := b.Release(ctx(t), "payout:hot", s.ID, g.Token); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				spans = append(spans, span{g.Token, call, time.Now()})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if len(spans) < workers {
		t.Fatalf("only %d grants under contention", len(spans))
	}
	for _, a := range spans {
		for _, c := range spans {
			if c.acqCall.After(a.relDone) && c.token <= a.token {
				t.Fatalf("grant %d started after grant %d was released, with a lower token", c.token, a.token)
			}
		}
	}
}

func testTokensAcrossRestart(t *testing.T, st Store) {
	var last fencing.Token
	for restart := range 3 {
		b := st.Open(t)
		s := session(t, b, "owner", 30*time.Second)
		for i := range 3 {
			g := acquire(t, b, fmt.Sprintf("payout:r-%d", i), s)
			if g.Token <= last {
				t.Fatalf("after restart %d: token %d issued after %d", restart, g.Token, last)
			}
			last = g.Token
			if _, err := b.Release(ctx(t), g.Key, s.ID, g.Token); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := b.CloseSession(ctx(t), s.ID); err != nil {
			t.Fatal(err)
		}
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

func testReacquire(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "owner", 30*time.Second)
	g1 := acquire(t, b, "payout:acc-1", s)
	g2 := acquire(t, b, "payout:acc-1", s)
	if g1.Token != g2.Token {
		t.Fatalf("re-acquire minted a new token: %d then %d", g1.Token, g2.Token)
	}
	recs, err := b.Grants(ctx(t), 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 {
		t.Fatalf("re-acquire logged another grant: %+v", recs)
	}
}

func testLockHeld(t *testing.T, st Store) {
	b := st.Open(t)
	s1 := session(t, b, "one", 30*time.Second)
	s2 := session(t, b, "two", 30*time.Second)
	g := acquire(t, b, "payout:acc-1", s1)
	_, err := b.Acquire(ctx(t), "payout:acc-1", s2.ID)
	wantCode(t, err, problem.LockHeld, "acquire by another session")
	var pe *problem.Error
	errors.As(err, &pe)
	var holder string
	if !pe.Extension("holder", &holder) || holder != "one" {
		t.Fatalf("lock_held should name the holder: %+v", pe)
	}
	// The failed attempt minted nothing and changed nothing.
	l, err := b.Lock(ctx(t), "payout:acc-1")
	if err != nil || !l.Held || l.Token != g.Token || l.SessionID != s1.ID {
		t.Fatalf("lock after refused acquire: %+v %v", l, err)
	}
	if _, err := b.Release(ctx(t), "payout:acc-1", s1.ID, g.Token); err != nil {
		t.Fatal(err)
	}
	g2 := acquire(t, b, "payout:acc-1", s2)
	if g2.Token <= g.Token {
		t.Fatalf("token %d after %d", g2.Token, g.Token)
	}
}

func testReleaseNonHolder(t *testing.T, st Store) {
	b := st.Open(t)
	s1 := session(t, b, "one", 30*time.Second)
	s2 := session(t, b, "two", 30*time.Second)
	g := acquire(t, b, "payout:acc-1", s1)
	_, err := b.Release(ctx(t), "payout:acc-1", s2.ID, g.Token)
	wantCode(t, err, problem.NotHeld, "release by another session")
	_, err = b.Release(ctx(t), "payout:acc-1", s1.ID, g.Token+1000)
	wantCode(t, err, problem.NotHeld, "release with the wrong token")
	_, err = b.Release(ctx(t), "payout:other", s1.ID, g.Token)
	wantCode(t, err, problem.NotHeld, "release of another key")
	l, _ := b.Lock(ctx(t), "payout:acc-1")
	if !l.Held || l.Token != g.Token {
		t.Fatalf("refused releases changed the lock: %+v", l)
	}
	rec, err := b.Release(ctx(t), "payout:acc-1", s1.ID, g.Token)
	if err != nil {
		t.Fatal(err)
	}
	if rec.Token != g.Token || rec.EndReason != backend.EndReleased || rec.EndedAt == nil {
		t.Fatalf("release record: %+v", rec)
	}
	_, err = b.Release(ctx(t), "payout:acc-1", s1.ID, g.Token)
	wantCode(t, err, problem.NotHeld, "second release")
}

func testGrantLog(t *testing.T, st Store) {
	b := st.Open(t)
	hi, err := b.HighToken(ctx(t))
	if err != nil || hi != 0 {
		t.Fatalf("high token of an empty store: %d %v", hi, err)
	}
	s := session(t, b, "logger", 30*time.Second)
	var tokens []fencing.Token
	for i := range 7 {
		g := acquire(t, b, fmt.Sprintf("payout:g-%d", i), s)
		tokens = append(tokens, g.Token)
		if i%2 == 0 {
			if _, err := b.Release(ctx(t), g.Key, s.ID, g.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	var got []backend.GrantRecord
	var after fencing.Token
	for {
		page, err := b.Grants(ctx(t), after, 3)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, page...)
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].Token
	}
	if len(got) != len(tokens) {
		t.Fatalf("grant log has %d records, want %d: %+v", len(got), len(tokens), got)
	}
	for i, r := range got {
		if r.Token != tokens[i] || r.Key != fmt.Sprintf("payout:g-%d", i) || r.Owner != "logger" || r.SessionID != s.ID || r.GrantedAt.IsZero() {
			t.Fatalf("record %d: %+v (token want %d)", i, r, tokens[i])
		}
		released := i%2 == 0
		if released != (r.EndReason == backend.EndReleased) || released != (r.EndedAt != nil) {
			t.Fatalf("record %d end: %+v", i, r)
		}
	}
	hi, err = b.HighToken(ctx(t))
	if err != nil || hi < tokens[len(tokens)-1] {
		t.Fatalf("high token %d < last issued %d (%v)", hi, tokens[len(tokens)-1], err)
	}
}

func testIntrospection(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "intro", 30*time.Second)
	g := acquire(t, b, "payout:i-1", s)
	acquire(t, b, "payout:i-2", s)
	acquire(t, b, "other:i-3", s)
	l, err := b.Lock(ctx(t), "payout:i-1")
	if err != nil || !l.Held || l.Token != g.Token || l.Owner != "intro" || l.SessionID != s.ID || l.ServerExpiry.IsZero() {
		t.Fatalf("lock: %+v %v", l, err)
	}
	free, err := b.Lock(ctx(t), "payout:nobody")
	if err != nil || free.Held {
		t.Fatalf("free lock: %+v %v", free, err)
	}
	ls, err := b.Locks(ctx(t), "payout:", 100)
	if err != nil || len(ls) != 2 || ls[0].Key != "payout:i-1" || ls[1].Key != "payout:i-2" {
		t.Fatalf("locks with prefix: %+v %v", ls, err)
	}
	all, err := b.Locks(ctx(t), "", 100)
	if err != nil || len(all) != 3 {
		t.Fatalf("all locks: %+v %v", all, err)
	}
	got, err := b.Session(ctx(t), s.ID)
	if err != nil || got.State != backend.StateActive || got.Owner != "intro" || got.ExpiresAt.IsZero() || got.LastHeartbeatAt.IsZero() {
		t.Fatalf("session: %+v %v", got, err)
	}
}

func testChanged(t *testing.T, st Store) {
	b := st.Open(t)
	s := session(t, b, "holder", 30*time.Second)
	g := acquire(t, b, "payout:w", s)
	ch, cancel := b.Changed("payout:w")
	defer cancel()
	if _, err := b.Release(ctx(t), "payout:w", s.ID, g.Token); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ch:
	case <-time.After(Timeout):
		t.Fatal("release did not signal the waiter")
	}
}
