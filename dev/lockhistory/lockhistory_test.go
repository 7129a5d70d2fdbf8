package lockhistory

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func grant(token int64, key, session string, granted, ended time.Duration, reason string) lockclient.GrantRecord {
	r := lockclient.GrantRecord{Token: fencing.Token(token), Key: key, SessionID: session, GrantedAt: t0.Add(granted)}
	if ended > 0 {
		e := t0.Add(ended)
		r.EndedAt, r.EndReason = &e, &reason
	}
	return r
}

func check(t *testing.T, recs []lockclient.GrantRecord, clock Clock) error {
	t.Helper()
	_, err := Check(FromGrants(recs, clock), time.Minute, filepath.Join(t.TempDir(), "viz.html"))
	return err
}

var exact = Clock{Exact: true}
var loose = Clock{Slack: 2 * time.Second}

func TestGrantLogOfAMutexIsLinearizable(t *testing.T) {
	ms := time.Millisecond
	recs := []lockclient.GrantRecord{
		grant(10, "payout:a", "s1", 1*ms, 5*ms, "released"),
		grant(12, "payout:b", "s2", 2*ms, 0, ""), // still held
		grant(15, "payout:a", "s2", 6*ms, 9*ms, "expired"),
		grant(20, "payout:a", "s3", 9*ms, 30*ms, "revoked"),
	}
	for _, c := range []Clock{exact, loose} {
		if err := check(t, recs, c); err != nil {
			t.Fatalf("clock %+v: %v", c, err)
		}
	}
	if err := check(t, nil, exact); err != nil {
		t.Fatalf("empty history: %v", err)
	}
}

func TestOverlappingGrantsAreIllegal(t *testing.T) {
	ms := time.Millisecond
	// Grant 15 is made while grant 10 of the same key is live.
	recs := []lockclient.GrantRecord{
		grant(10, "payout:a", "s1", 1*ms, 8*ms, "released"),
		grant(15, "payout:a", "s2", 5*ms, 9*ms, "released"),
	}
	if err := check(t, recs, exact); !errors.Is(err, ErrNotLinearizable) {
		t.Fatalf("overlap in exact times: %v, want not linearizable", err)
	}
	// Released (or revoked) well after another session's grant of the key,
	// and by more than the slack: illegal with the service's clock too.
	// Before, a loose clock let every end fall right after its own grant,
	// so no two grants that both ended could overlap.
	for _, reason := range []string{"released", "revoked"} {
		recs = []lockclient.GrantRecord{
			grant(10, "payout:a", "s1", time.Second, 60*time.Second, reason),
			grant(15, "payout:a", "s2", 10*time.Second, 50*time.Second, "released"),
		}
		if err := check(t, recs, loose); !errors.Is(err, ErrNotLinearizable) {
			t.Fatalf("grant 10 %s at 60 s, grant 15 at 10 s, service clock: %v, want not linearizable", reason, err)
		}
	}
	// An expiry is recorded when the service sees it: ended before the next
	// grant, seen after it, is legal.
	recs = []lockclient.GrantRecord{
		grant(10, "payout:a", "s1", time.Second, 15*time.Second, "expired"),
		grant(15, "payout:a", "s2", 10*time.Second, 50*time.Second, "released"),
	}
	if err := check(t, recs, loose); err != nil {
		t.Fatalf("an expiry seen after the next grant: %v, want linearizable", err)
	}
	// A release recorded within the slack after the next grant is legal.
	recs = []lockclient.GrantRecord{
		grant(10, "payout:a", "s1", time.Second, 10*time.Second+500*time.Millisecond, "released"),
		grant(15, "payout:a", "s2", 10*time.Second, 50*time.Second, "released"),
	}
	if err := check(t, recs, loose); err != nil {
		t.Fatalf("a release recorded 0.5 s after the next grant, 2 s slack: %v, want linearizable", err)
	}
	// A grant that never ended and a later one: illegal however loose the clock.
	recs = []lockclient.GrantRecord{
		grant(10, "payout:a", "s1", 1*ms, 0, ""),
		grant(15, "payout:a", "s2", 5*time.Second, 0, ""),
	}
	if err := check(t, recs, loose); !errors.Is(err, ErrNotLinearizable) {
		t.Fatalf("two live grants: %v, want not linearizable", err)
	}
}

func TestTokensMustIncrease(t *testing.T) {
	// A re-issued (lower or equal) token after the key was free again.
	for _, tok := range []int64{10, 9} {
		recs := []lockclient.GrantRecord{
			grant(10, "payout:a", "s1", time.Millisecond, 2*time.Millisecond, "released"),
			grant(tok, "payout:a", "s2", 10*time.Second, 0, ""),
		}
		if err := check(t, recs, loose); !errors.Is(err, ErrNotLinearizable) {
			t.Fatalf("token %d after 10: %v, want not linearizable", tok, err)
		}
	}
}

func TestModelRefusedAcquireNeedsAHolder(t *testing.T) {
	ops := []porcupine.Operation{
		{ClientId: 0, Input: Input{Op: OpAcquire, Key: "k", Session: "s1"}, Output: Output{OK: false}, Call: 0, Return: 1},
	}
	if res := porcupine.CheckOperations(Model, ops); res {
		t.Fatal("lock_held on a free key accepted")
	}
	ops = append([]porcupine.Operation{
		{ClientId: 1, Input: Input{Op: OpAcquire, Key: "k", Session: "s2"}, Output: Output{OK: true, Token: 3}, Call: -5, Return: -4},
	}, ops...)
	if res := porcupine.CheckOperations(Model, ops); !res {
		t.Fatal("lock_held while another session holds the key refused")
	}
}

func TestModelAcknowledgedKeepaliveMeansStillHeld(t *testing.T) {
	granted := porcupine.Operation{ClientId: 0, Input: Input{Op: OpAcquire, Key: "k", Session: "s1"}, Output: Output{OK: true, Token: 3}, Call: 0, Return: 1}
	keepalive := porcupine.Operation{ClientId: 0, Input: Input{Op: OpKeepalive, Key: "k", Session: "s1", Token: 3}, Output: Output{OK: true}, Call: 10, Return: 11}
	if !porcupine.CheckOperations(Model, []porcupine.Operation{granted, keepalive}) {
		t.Fatal("the holder's acknowledged keepalive refused")
	}
	// The grant expired and another session took the key before the
	// keepalive was sent: acknowledging it would say the session still holds.
	expired := porcupine.Operation{ClientId: 0, Input: Input{Op: OpExpire, Key: "k", Session: "s1", Token: 3}, Output: Output{OK: true}, Call: 2, Return: 3}
	taken := porcupine.Operation{ClientId: 1, Input: Input{Op: OpAcquire, Key: "k", Session: "s2"}, Output: Output{OK: true, Token: 4}, Call: 4, Return: 5}
	if porcupine.CheckOperations(Model, []porcupine.Operation{granted, expired, taken, keepalive}) {
		t.Fatal("a keepalive acknowledged after the key was taken over accepted")
	}
}
