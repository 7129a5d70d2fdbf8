package railproxy

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/payouts/payouts/railproxy/proxyclient"
)

// maxOutcomeGroup bounds the outcomes one statement writes.
const maxOutcomeGroup = 256

// outcomeGroupSQL writes a group of outcomes, each once: a row whose
// outcome is already recorded is not updated (the first outcome stands, and
// the schema's trigger would refuse a second one) and returns nothing. The
// rows are found through the primary key (id = ANY($1)): joined on
// u.sub_id alone, a large group is planned as a scan of every row without
// an outcome (TestOutcomeGroupPlan).
const outcomeGroupSQL = `
UPDATE rail_submission SET outcome = u.new_outcome, rail_ref = u.new_rail_ref, error_code = u.new_error_code
  FROM unnest($1::bigint[], $2::text[], $3::text[], $4::text[]) AS u(sub_id, new_outcome, new_rail_ref, new_error_code)
 WHERE id = ANY($1::bigint[]) AND id = u.sub_id AND outcome IS NULL
RETURNING ` + recordCols

// outcomeGroups coalesces the outcomes recorded concurrently in the process
// (group commit): one caller at a time holds the turn and writes every
// outcome waiting — up to maxOutcomeGroup, its own first — in one statement,
// one transaction; the outcomes arriving meanwhile wait for the next turn,
// which passes to the oldest of them. Nobody waits when nothing is being
// written: an idle proxy writes an outcome at once. The zero value is ready.
type outcomeGroups struct {
	mu       sync.Mutex
	queue    []*pendingOutcome // waiting, oldest first; empty whenever the turn is free
	turnHeld bool              // a caller writes a group or has been handed the turn

	groupSize prometheus.Observer // outcomes per statement (nil: not observed)
	written   atomic.Int64        // group statements sent
}

// pendingOutcome is one caller's outcome waiting for a group.
type pendingOutcome struct {
	id        int64
	outcome   proxyclient.Outcome
	railRef   string
	errorCode string
	// done carries the one message the caller gets: its result, or the
	// turn to write the next group (which then includes it).
	done chan outcomeDone
	// Under outcomeGroups.mu:
	taken bool // in a group being written
	turn  bool // handed the turn
}

type outcomeDone struct {
	rec  proxyclient.Record
	err  error
	turn bool
}

// recordOutcome writes a forwarded submission's outcome, once, in a group
// with the other outcomes being recorded. An outcome already recorded is
// pgx.ErrNoRows (the first one stands); an error of the group's statement
// is every one of its callers' error. ctx bounds the wait for a group only
// while the outcome has not been taken into one; a group's statement has a
// deadline of its own (dbTimeout).
func (st *store) recordOutcome(ctx context.Context, id int64, outcome proxyclient.Outcome, railRef, errorCode string) (proxyclient.Record, error) {
	p := &pendingOutcome{id: id, outcome: outcome, railRef: railRef, errorCode: errorCode, done: make(chan outcomeDone, 1)}
	g := &st.outcomes
	g.mu.Lock()
	g.queue = append(g.queue, p)
	if !g.turnHeld {
		g.turnHeld, p.turn = true, true
		g.mu.Unlock()
		return st.writeOutcomeGroup(ctx, p)
	}
	g.mu.Unlock()
	select {
	case d := <-p.done:
		if d.turn {
			return st.writeOutcomeGroup(ctx, p)
		}
		return d.rec, d.err
	case <-ctx.Done():
		if g.withdraw(p) {
			return proxyclient.Record{}, fmt.Errorf("wait for an outcome group: %w", ctx.Err())
		}
		// Already in a group being written: its result comes.
		d := <-p.done
		return d.rec, d.err
	}
}

// writeOutcomeGroup writes the group self's turn takes, hands the turn on
// and gives every other member its result.
func (st *store) writeOutcomeGroup(ctx context.Context, self *pendingOutcome) (proxyclient.Record, error) {
	g := &st.outcomes
	g.mu.Lock()
	group := g.take()
	g.mu.Unlock()

	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), dbTimeout)
	recs, err := st.updateOutcomes(wctx, group)
	cancel()
	g.written.Add(1)
	if g.groupSize != nil {
		g.groupSize.Observe(float64(len(group)))
	}

	g.mu.Lock()
	g.passTurn()
	g.mu.Unlock()
	var mine outcomeDone
	for _, p := range group {
		d := outcomeDone{err: err}
		if err == nil {
			var ok bool
			if d.rec, ok = recs[p.id]; !ok {
				d.err = pgx.ErrNoRows
			}
		}
		if p == self {
			mine = d
		} else {
			p.done <- d
		}
	}
	return mine.rec, mine.err
}

// take removes the next group from the queue (mu held): the oldest
// outcomes, at most one per submission — a second outcome for the same
// submission waits for the next group, where it finds the first recorded.
func (g *outcomeGroups) take() []*pendingOutcome {
	group := make([]*pendingOutcome, 0, min(len(g.queue), maxOutcomeGroup))
	ids := make(map[int64]bool, cap(group))
	rest := g.queue[:0]
	for _, p := range g.queue {
		if len(group) == maxOutcomeGroup || ids[p.id] {
			rest = append(rest, p)
			continue
		}
		ids[p.id], p.taken = true, true
		group = append(group, p)
	}
	clear(g.queue[len(rest):])
	g.queue = rest
	return group
}

// passTurn hands the turn to the oldest waiting outcome, or releases it
// (mu held).
func (g *outcomeGroups) passTurn() {
	if len(g.queue) == 0 {
		g.turnHeld = false
		return
	}
	next := g.queue[0]
	next.turn = true
	next.done <- outcomeDone{turn: true}
}

// withdraw takes p out of the queue if no group has taken it, handing on
// the turn if p held it; it reports whether p was withdrawn.
func (g *outcomeGroups) withdraw(p *pendingOutcome) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if p.taken {
		return false
	}
	for i, q := range g.queue {
		if q == p {
			g.queue = append(g.queue[:i], g.queue[i+1:]...)
			break
		}
	}
	if p.turn {
		g.passTurn()
	}
	return true
}

// queued is the number of outcomes waiting for a group.
func (g *outcomeGroups) queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.queue)
}

// updateOutcomes runs outcomeGroupSQL for group and returns the rows it
// wrote by submission id.
func (st *store) updateOutcomes(ctx context.Context, group []*pendingOutcome) (map[int64]proxyclient.Record, error) {
	ids := make([]int64, len(group))
	outcomes, refs, codes := make([]string, len(group)), make([]*string, len(group)), make([]*string, len(group))
	for i, p := range group {
		ids[i], outcomes[i], refs[i], codes[i] = p.id, string(p.outcome), nullIfEmpty(p.railRef), nullIfEmpty(p.errorCode)
	}
	rows, err := st.pool.Query(ctx, outcomeGroupSQL, ids, outcomes, refs, codes)
	if err != nil {
		return nil, fmt.Errorf("record %d outcomes: %w", len(group), err)
	}
	recs, err := collectRecords(rows)
	if err != nil {
		return nil, fmt.Errorf("record %d outcomes: %w", len(group), err)
	}
	byID := make(map[int64]proxyclient.Record, len(recs))
	for _, r := range recs {
		byID[r.ID] = r
	}
	return byID, nil
}
