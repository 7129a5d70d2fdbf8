// Package safetylog writes and pages the safety_event table that both
// guards keep (paydb and proxydb share its shape), so that a reader paging
// by id never skips an event.
//
// Paging by id alone is unsafe when ids are handed out before commit: an
// event that took id 5 but commits after id 6 was read is behind the
// reader's cursor for good. Writers therefore take one transaction-scoped
// lock before inserting: ids are assigned and committed in the same order
// (the lock is released only after the commit is visible), so every
// snapshot sees a prefix of the committed ids and a cursor taken from any
// page never passes an event that can still appear. Safety events are rare
// (each one is incident-grade); serialising their writers costs nothing.
package safetylog

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
)

// writerLock is the advisory lock id that serialises the writers of
// safety_event within one database.
const writerLock int64 = 0x7361666574790001

// Event is one safety event to record.
type Event struct {
	Kind         string
	Key          string
	Presented    fencing.Token
	Stored       fencing.Token // 0: none (recorded as NULL)
	Holder       fencing.Holder
	StoredHolder fencing.Holder // "": none (recorded as NULL)
	PayoutID     string
	Detail       string
}

// Insert records events in tx — a transaction of their own (D-1), which
// the caller commits at once — after taking the writer lock.
func Insert(ctx context.Context, tx pgx.Tx, events ...Event) error {
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, writerLock); err != nil {
		return fmt.Errorf("safety_event writer lock: %w", err)
	}
	for _, e := range events {
		if _, err := tx.Exec(ctx, `
			INSERT INTO safety_event (kind, key, presented_token, stored_token, holder, stored_holder, payout_id, detail)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
			e.Kind, e.Key, int64(e.Presented), nullIfZero(int64(e.Stored)), string(e.Holder),
			nullIfEmpty(string(e.StoredHolder)), nullIfEmpty(e.PayoutID), e.Detail); err != nil {
			return fmt.Errorf("insert %s safety event: %w", e.Kind, err)
		}
	}
	return nil
}

// Querier is a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// List reads up to limit events with id > after, in id order.
func List(ctx context.Context, q Querier, after int64, limit int) ([]wire.SafetyEvent, error) {
	rows, err := q.Query(ctx, `
		SELECT id, kind, coalesce(key, ''), coalesce(presented_token, 0), coalesce(stored_token, 0),
		       coalesce(holder, ''), coalesce(stored_holder, ''), coalesce(payout_id, ''), coalesce(detail, ''), at
		  FROM safety_event WHERE id > $1 ORDER BY id LIMIT $2`, after, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (wire.SafetyEvent, error) {
		var e wire.SafetyEvent
		var presented, stored int64
		var holder, storedHolder string
		err := row.Scan(&e.ID, &e.Kind, &e.Key, &presented, &stored, &holder, &storedHolder, &e.PayoutID, &e.Detail, &e.At)
		e.PresentedToken, e.StoredToken = fencing.Token(presented), fencing.Token(stored)
		e.Holder, e.StoredHolder = fencing.Holder(holder), fencing.Holder(storedHolder)
		e.At = e.At.UTC()
		return e, err
	})
}

func nullIfZero(v int64) *int64 {
	if v == 0 {
		return nil
	}
	return &v
}

func nullIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
