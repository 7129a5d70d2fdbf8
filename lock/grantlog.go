package lock

import (
	"net/http"
	"strconv"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/lock/fencing"
	"github.com/payouts/payouts/lock/lockclient"
)

// The grant log and the high token.

func (s *Service) grants(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after_token", "limit")
	if err != nil {
		return err
	}
	after, err := queryInt(q, "after_token", 0, 0, int64(fencing.MaxToken))
	if err != nil {
		return err
	}
	limit, err := queryInt(q, "limit", 100, 1, 1000)
	if err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	recs, err := s.b.Grants(ctx, fencing.Token(after), int(limit))
	if err != nil {
		return err
	}
	out := lockclient.GrantPage{Items: make([]lockclient.GrantRecord, 0, len(recs))}
	for _, g := range recs {
		out.Items = append(out.Items, grantRecord(g))
	}
	if len(recs) == int(limit) {
		out.Next = strconv.FormatInt(int64(recs[len(recs)-1].Token), 10)
	}
	httpx.WriteJSON(w, http.StatusOK, out)
	return nil
}

func (s *Service) highToken(w http.ResponseWriter, r *http.Request) error {
	if _, err := wire.Query(r.URL.RawQuery); err != nil {
		return err
	}
	ctx, cancel := op(r)
	defer cancel()
	t, err := s.b.HighToken(ctx)
	if err != nil {
		return err
	}
	httpx.WriteJSON(w, http.StatusOK, lockclient.HighTokenResponse{Token: t})
	return nil
}
