// Package wire holds what every role's wire contract shares: the list page
// and its cursors, the safety-event record, and the one definition of field
// limits and id patterns that every server checks its input against (so a
// value one role accepts is never refused by the next one downstream).
package wire

import (
	"net/url"
	"strconv"

	"github.com/payouts/payouts/internal/problem"
)

// Page is one page of a list endpoint: {items: [...], next: "<cursor>"}.
// Next is "" on the last page; pass it back as the after parameter to get
// the following page.
type Page[T any] struct {
	Items []T    `json:"items"`
	Next  string `json:"next"`
}

// Page sizes of every list endpoint, and of the bulk reads the
// reconciler streams (their items are small digests).
const (
	DefaultLimit     = 100
	MaxLimit         = 1000
	DefaultBulkLimit = 1000
	MaxBulkLimit     = 10000
)

// NewPage builds the page for items read with limit: a full page carries
// the cursor of its last item, a short one ends the list. Items is never
// null on the wire.
func NewPage[T any](items []T, limit int, cursor func(T) string) Page[T] {
	if items == nil {
		items = []T{}
	}
	p := Page[T]{Items: items}
	if limit > 0 && len(items) == limit {
		p.Next = cursor(items[len(items)-1])
	}
	return p
}

// PageQuery is the query of a page request (after "" and limit 0 are left
// out: the first page, the server's default size).
func PageQuery(after string, limit int) url.Values {
	q := url.Values{}
	if after != "" {
		q.Set("after", after)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	return q
}

// IDCursor is the cursor of a list paged by row id (0: from the start).
func IDCursor(id int64) string {
	if id <= 0 {
		return ""
	}
	return strconv.FormatInt(id, 10)
}

// ParseLimit reads the limit query parameter (DefaultLimit when absent).
func ParseLimit(q url.Values) (int, error) { return parseLimit(q, DefaultLimit, MaxLimit) }

// ParseBulkLimit reads the limit of a bulk read (DefaultBulkLimit when
// absent, at most MaxBulkLimit).
func ParseBulkLimit(q url.Values) (int, error) { return parseLimit(q, DefaultBulkLimit, MaxBulkLimit) }

func parseLimit(q url.Values, def, maxN int) (int, error) {
	v := q.Get("limit")
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxN {
		return 0, BadField("limit", "must be an integer from 1 to %d, got %q", maxN, v)
	}
	return n, nil
}

// ParseIDCursor reads an after parameter of a list paged by row id.
func ParseIDCursor(q url.Values) (int64, error) {
	v := q.Get("after")
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, BadField("after", "must be a cursor from a previous page (a non-negative integer), got %q", v)
	}
	return n, nil
}

// ParseKeyCursor reads an after parameter of a list paged by id (an account
// or payout id): anything that is not an id is refused before it reaches SQL.
func ParseKeyCursor(q url.Values) (string, error) {
	v := q.Get("after")
	if v != "" && !IDPattern.MatchString(v) {
		return "", BadField("after", "is not a cursor this service issued: %q", v)
	}
	return v, nil
}

// BadField is an invalid_request naming the field it is about. The field
// may be the caller's own input (an unknown query parameter): it is an
// argument of the message, never part of its format, and both the message
// and the field member repeat at most problem.MaxEchoArg bytes of it.
func BadField(field, format string, args ...any) *problem.Error {
	return problem.New(problem.InvalidRequest, "%s: "+format, append([]any{field}, args...)...).With("field", problem.Echo(field))
}
