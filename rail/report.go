package rail

import (
	"net/http"
	"slices"
	"sort"

	"github.com/payouts/payouts/internal/httpx"
	"github.com/payouts/payouts/internal/wire"
	"github.com/payouts/payouts/rail/railclient"
)

// refIndex keeps the client references the rail has seen in byte order,
// for the paged settlement report: refs is sorted; fresh holds the
// references first seen since, merged in when a page is read.
type refIndex struct {
	refs  []string
	fresh []string
}

// add records a client reference seen for the first time.
func (x *refIndex) add(ref string) { x.fresh = append(x.fresh, ref) }

// sorted merges the fresh references in and returns every reference in
// byte order.
func (x *refIndex) sorted() []string {
	if len(x.fresh) == 0 {
		return x.refs
	}
	slices.Sort(x.fresh)
	merged := make([]string, 0, len(x.refs)+len(x.fresh))
	i, j := 0, 0
	for i < len(x.refs) && j < len(x.fresh) {
		if x.refs[i] < x.fresh[j] {
			merged = append(merged, x.refs[i])
			i++
		} else {
			merged = append(merged, x.fresh[j])
			j++
		}
	}
	merged = append(append(merged, x.refs[i:]...), x.fresh[j:]...)
	x.refs, x.fresh = merged, nil
	return x.refs
}

// report answers GET /settlement-report: without parameters every payment
// ever accepted, in the order accepted (DESIGN §4); with after or limit,
// one page in client-reference order.
func (s *Server) report(w http.ResponseWriter, r *http.Request) error {
	q, err := wire.Query(r.URL.RawQuery, "after", "limit")
	if err != nil {
		return err
	}
	if len(q) == 0 {
		s.mu.Lock()
		items := append([]railclient.Payment{}, s.payments...)
		s.mu.Unlock()
		httpx.WriteJSON(w, http.StatusOK, railclient.Report{Items: items})
		return nil
	}
	limit, err := wire.ParseBulkLimit(q)
	if err != nil {
		return err
	}
	after := q.Get("after")
	if after != "" {
		if err := wire.ValidRef("after", after); err != nil {
			return err
		}
	}
	httpx.WriteJSON(w, http.StatusOK, s.reportPage(after, limit))
	return nil
}

// reportPage is the payments of whole client references after after, at
// least limit of them unless the report ends first.
func (s *Server) reportPage(after string, limit int) railclient.Report {
	s.mu.Lock()
	defer s.mu.Unlock()
	refs := s.refs.sorted()
	i := sort.SearchStrings(refs, after)
	if i < len(refs) && refs[i] == after {
		i++
	}
	out := railclient.Report{Items: make([]railclient.Payment, 0, min(limit, len(s.payments))+1)}
	for ; i < len(refs) && len(out.Items) < limit; i++ {
		for _, k := range s.byRef[refs[i]] {
			out.Items = append(out.Items, s.payments[k])
		}
	}
	if i < len(refs) {
		out.Next = refs[i-1]
	}
	return out
}
