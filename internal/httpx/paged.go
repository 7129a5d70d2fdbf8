package httpx

import (
	"context"
	"net/http"
	"net/url"

	"github.com/payouts/payouts/internal/wire"
)

// PagedByID serves a list paged by row id (?after=<id>&limit=, the limit
// read by parseLimit: wire.ParseLimit, or wire.ParseBulkLimit for a bulk
// read): read gives the items after the cursor, id each item's id, and
// the answer is a wire.Page whose next is the last item's id when the page
// is full. Other query parameters, a repeated one, a bad cursor or limit
// are 400 naming it.
func PagedByID[T any](parseLimit func(url.Values) (int, error), read func(ctx context.Context, after int64, limit int) ([]T, error), id func(T) int64) http.HandlerFunc {
	return Handler(func(w http.ResponseWriter, r *http.Request) error {
		q, err := wire.Query(r.URL.RawQuery, "after", "limit")
		if err != nil {
			return err
		}
		limit, err := parseLimit(q)
		if err != nil {
			return err
		}
		after, err := wire.ParseIDCursor(q)
		if err != nil {
			return err
		}
		items, err := read(r.Context(), after, limit)
		if err != nil {
			return err
		}
		WriteJSON(w, http.StatusOK, wire.NewPage(items, limit, func(v T) string { return wire.IDCursor(id(v)) }))
		return nil
	})
}
