package executor

import (
	"fmt"
	"os"
)

// Point names a moment in a payout's journey where a test hook can act.
type Point string

// The hook points, in the order a payout passes them.
const (
	AfterClaimed    Point = "claimed"    // claim (or re-claim) accepted: CLAIMED under our token
	AfterSubmitting Point = "submitting" // RAIL_SUBMITTED recorded, the proxy not yet called
	AfterSubmitted  Point = "submitted"  // the proxy answered, the outcome not yet reported
	AfterOutcome    Point = "outcome"    // the outcome reported (RAIL_ACKED, FAILED or RAIL_AMBIGUOUS)
	AfterPosted     Point = "posted"     // POSTED
)

// Points lists every hook point.
var Points = []Point{AfterClaimed, AfterSubmitting, AfterSubmitted, AfterOutcome, AfterPosted}

// Test hooks: environment variables read only by binaries built with
// -tags crashpoints (as the proxy's PAYOUTS_PROXY_CRASH_POINT). Ordinary
// builds ignore them and say so at start.
const (
	// HoldAfterEnv: after the named point, log "test hook: holding" and
	// block until the grant is lost (the test pauses the process past its
	// session TTL with SIGSTOP), then carry on with that payout WITHOUT the
	// client-side grant check — a process that was paused between its check
	// and its write. The guards must fence every such write out (UC-03).
	HoldAfterEnv = "PAYOUTS_EXECUTOR_TEST_HOLD_AFTER"
	// CrashAfterEnv: after the named point, exit at once with status 3
	// (no release, no session close: a crash).
	CrashAfterEnv = "PAYOUTS_EXECUTOR_TEST_CRASH_AFTER"
)

// CrashExitCode is the exit status of a crash hook.
const CrashExitCode = 3

// Hooks are the test hooks in effect. The zero value (every production
// build) does nothing.
type Hooks struct {
	HoldAfter  Point
	CrashAfter Point
}

func (h Hooks) check() error {
	for _, p := range []struct {
		env string
		v   Point
	}{{HoldAfterEnv, h.HoldAfter}, {CrashAfterEnv, h.CrashAfter}} {
		if p.v == "" {
			continue
		}
		ok := false
		for _, q := range Points {
			ok = ok || p.v == q
		}
		if !ok {
			return fmt.Errorf("executor: %s=%q: want one of %v", p.env, p.v, Points)
		}
	}
	return nil
}

// ignoredHookEnv lists hook variables set in the environment of a build
// that does not honour them.
func ignoredHookEnv() []string {
	var out []string
	for _, k := range []string{HoldAfterEnv, CrashAfterEnv} {
		if os.Getenv(k) != "" {
			out = append(out, k)
		}
	}
	return out
}
