// Package lockhistory checks lock histories for linearizability (INV-06)
// with porcupine: the fenced-mutex model, and a history built from the lock
// service's grant log (D-9), so that whole-system tests can check what the
// service itself recorded.
package lockhistory

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// Operations of the model.
const (
	OpAcquire = "acquire"
	OpRelease = "release"
	OpExpire  = "expire" // any end that is not a release by the holder: expiry, revocation
	// OpKeepalive is a renewal of the holder's session: acknowledged, it
	// says the session still holds its grant and nobody took the key over.
	OpKeepalive = "keepalive"
)

// State is the fenced mutex of one key: who holds it with which token, and
// the highest token ever granted.
type State struct {
	Holder string // session id; "" when free
	Token  fencing.Token
	High   fencing.Token
}

// Input is one operation on a key by a session (Token: for release, expire
// and keepalive).
type Input struct {
	Op      string
	Key     string
	Session string
	Token   fencing.Token
}

// Output is its result: granted or not (acquire), ended or not (release).
type Output struct {
	OK    bool
	Token fencing.Token // acquire
}

func short(s string) string {
	if len(s) > 6 {
		return s[:6]
	}
	return s
}

// Model is the fenced mutex: an acquire is legal only when the key is free
// and its token is above every earlier one; only the holder's own grant
// can end. Histories are partitioned by key.
var Model = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(Input).Key
			if _, ok := by[k]; !ok {
				keys = append(keys, k)
			}
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() interface{} { return State{} },
	Step: func(st, in, out interface{}) (bool, interface{}) {
		s, i, o := st.(State), in.(Input), out.(Output)
		switch i.Op {
		case OpAcquire:
			if !o.OK { // lock_held: someone else holds it
				return s.Holder != "" && s.Holder != i.Session, s
			}
			if s.Holder == "" && o.Token > s.High {
				return true, State{Holder: i.Session, Token: o.Token, High: o.Token}
			}
			return false, s
		case OpRelease:
			mine := s.Holder == i.Session && s.Token == i.Token
			if o.OK {
				return mine, State{High: s.High}
			}
			return !mine, s
		case OpExpire:
			if s.Holder == i.Session && s.Token == i.Token {
				return true, State{High: s.High}
			}
			return false, s
		case OpKeepalive:
			return o.OK && s.Holder == i.Session && s.Token == i.Token, s
		}
		return false, s
	},
	Equal: func(a, b interface{}) bool { return a.(State) == b.(State) },
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(Input), out.(Output)
		if i.Op == OpAcquire {
			if o.OK {
				return fmt.Sprintf("acquire(%s) -> token %d", short(i.Session), o.Token)
			}
			return fmt.Sprintf("acquire(%s) -> held", short(i.Session))
		}
		return fmt.Sprintf("%s(%s, %d) -> %v", i.Op, short(i.Session), i.Token, o.OK)
	},
	DescribeState: func(st interface{}) string {
		s := st.(State)
		if s.Holder == "" {
			return fmt.Sprintf("free (high %d)", s.High)
		}
		return fmt.Sprintf("held by %s with %d", short(s.Holder), s.Token)
	},
}

// Clock says how far the grant log's times can be trusted.
type Clock struct {
	// Exact: granted_at and ended_at are read inside the deciding
	// statement (PostgreSQL backend), so each operation is a point in time.
	Exact bool
	// Slack widens each acquire to [granted_at, granted_at+Slack] when the
	// times are the service's clock around the store's transaction (etcd
	// backend), and a release or revocation, which the service records as
	// it makes it, to ended_at±Slack; an expiry is recorded when the
	// service sees it, so it is known only to lie between its grant and
	// ended_at+Slack.
	Slack time.Duration
}

// FromGrants turns a grant log into a history: for each grant an acquire
// that succeeded with its token and, once it ended, a release (released)
// or expire (expired, revoked) by the same session. Each grant is its own
// client, so nothing is assumed about order beyond the recorded times.
func FromGrants(recs []lockclient.GrantRecord, clock Clock) []porcupine.Operation {
	if len(recs) == 0 {
		return nil
	}
	base := recs[0].GrantedAt
	for _, r := range recs {
		if r.GrantedAt.Before(base) {
			base = r.GrantedAt
		}
	}
	at := func(t time.Time) int64 { return int64(t.Sub(base)) }
	slack := int64(clock.Slack)
	if clock.Exact {
		slack = 0
	}
	ops := make([]porcupine.Operation, 0, 2*len(recs))
	for i, r := range recs {
		g := at(r.GrantedAt)
		ops = append(ops, porcupine.Operation{ClientId: i, Input: Input{Op: OpAcquire, Key: r.Key, Session: r.SessionID},
			Output: Output{OK: true, Token: r.Token}, Call: g, Return: g + slack})
		if r.EndedAt == nil {
			continue
		}
		op := OpExpire
		if r.EndReason != nil && *r.EndReason == "released" {
			op = OpRelease
		}
		e := at(*r.EndedAt)
		call, ret := e, e
		switch {
		case clock.Exact:
		case r.EndReason == nil || *r.EndReason == "expired":
			call, ret = g, max(e, g)+slack
		default: // released, revoked: when the service ended it
			call, ret = max(g, e-slack), max(e, g)+slack
		}
		ops = append(ops, porcupine.Operation{ClientId: i, Input: Input{Op: op, Key: r.Key, Session: r.SessionID, Token: r.Token},
			Output: Output{OK: true}, Call: call, Return: ret})
	}
	sort.SliceStable(ops, func(a, b int) bool { return ops[a].Call < ops[b].Call })
	return ops
}

// ErrNotLinearizable is returned by Check when the history is illegal.
var ErrNotLinearizable = errors.New("lock history is not linearizable")

// Check checks ops against Model within timeout. When the history is not
// linearizable (or the check ran out of time) and vizPath is set, it writes
// porcupine's visualisation there.
func Check(ops []porcupine.Operation, timeout time.Duration, vizPath string) (porcupine.CheckResult, error) {
	res, info := porcupine.CheckOperationsVerbose(Model, ops, timeout)
	if res == porcupine.Ok {
		return res, nil
	}
	msg := fmt.Sprintf("%d operations: %v", len(ops), res)
	if vizPath != "" {
		if err := porcupine.VisualizePath(Model, info, vizPath); err != nil {
			msg += fmt.Sprintf(" (visualisation not written: %v)", err)
		} else {
			msg += "; visualisation: " + vizPath
		}
	}
	if res == porcupine.Illegal {
		return res, fmt.Errorf("%w: %s", ErrNotLinearizable, msg)
	}
	return res, fmt.Errorf("lock history check did not finish: %s", msg)
}
