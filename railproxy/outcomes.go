package railproxy

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/payouts/payouts/internal/batcher"
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

// outcomeRequest is one outcome to record.
type outcomeRequest struct {
	id        int64
	outcome   proxyclient.Outcome
	railRef   string
	errorCode string
}

// outcomeAnswer is the row an outcome wrote; written is false when the
// submission's outcome was already recorded (the first one stands).
type outcomeAnswer struct {
	rec     proxyclient.Record
	written bool
}

// newStore returns the store over pool. Outcomes recorded concurrently in
// the process are written in groups (group commit, internal/batcher): an
// outcome recorded while a group is being written waits and goes out with
// the others in the next group, up to maxOutcomeGroup in one statement,
// one transaction; an idle proxy writes an outcome at once. observe, if
// set, is told every group's size.
func newStore(pool *pgxpool.Pool, observe func(int)) *store {
	st := &store{pool: pool}
	st.outcomes = batcher.New(st.writeOutcomes, batcher.Options{
		MaxBatch: maxOutcomeGroup, Parallel: 1, Timeout: dbTimeout, Observe: observe,
	})
	return st
}

// recordOutcome writes a forwarded submission's outcome, once, in a group
// with the other outcomes being recorded. An outcome already recorded is
// pgx.ErrNoRows (the first one stands); an error of the group's statement
// is every one of its callers' error. If ctx ends first, recordOutcome
// returns its error and the outcome may still be written.
func (st *store) recordOutcome(ctx context.Context, id int64, outcome proxyclient.Outcome, railRef, errorCode string) (proxyclient.Record, error) {
	a, err := st.outcomes.Do(ctx, outcomeRequest{id: id, outcome: outcome, railRef: railRef, errorCode: errorCode})
	switch {
	case err != nil:
		return proxyclient.Record{}, err
	case !a.written:
		return proxyclient.Record{}, pgx.ErrNoRows
	}
	return a.rec, nil
}

// writeOutcomes writes a group of outcomes (the batcher's Func): one
// statement for the group, a second one after it for a submission's second
// outcome in the same group, which then finds the first recorded.
func (st *store) writeOutcomes(ctx context.Context, reqs []outcomeRequest) ([]outcomeAnswer, error) {
	out := make([]outcomeAnswer, len(reqs))
	for _, round := range batcher.Distinct(len(reqs), func(i int) int64 { return reqs[i].id }) {
		n := len(round)
		ids, outcomes, refs, codes := make([]int64, n), make([]string, n), make([]*string, n), make([]*string, n)
		for k, i := range round {
			r := reqs[i]
			ids[k], outcomes[k], refs[k], codes[k] = r.id, string(r.outcome), nullIfEmpty(r.railRef), nullIfEmpty(r.errorCode)
		}
		rows, err := st.pool.Query(ctx, outcomeGroupSQL, ids, outcomes, refs, codes)
		if err != nil {
			return nil, fmt.Errorf("record %d outcomes: %w", n, err)
		}
		recs, err := collectRecords(rows)
		if err != nil {
			return nil, fmt.Errorf("record %d outcomes: %w", n, err)
		}
		byID := make(map[int64]proxyclient.Record, len(recs))
		for _, r := range recs {
			byID[r.ID] = r
		}
		for _, i := range round {
			out[i].rec, out[i].written = byID[reqs[i].id]
		}
	}
	return out, nil
}
