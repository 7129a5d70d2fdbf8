package httpx

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/payouts/payouts/internal/problem"
)

// metricMethods are the only methods that become a metric label: any other
// method a client sends is counted as "other", so a caller cannot create
// series at will.
var metricMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
	http.MethodPatch, http.MethodDelete, http.MethodOptions,
}

func metricMethod(m string) string {
	for _, known := range metricMethods {
		if m == known {
			return m
		}
	}
	return "other"
}

// methodNotAllowed answers a request whose path is routed but whose method
// is not: 405 with the Allow header listing the methods the path has (chi
// hands a custom handler no list, so it is asked route by route). A method
// on a path no route has is a plain 404.
func methodNotAllowed(mux chi.Routes, w http.ResponseWriter, r *http.Request) {
	path := routePath(r)
	var allowed []string
	for _, m := range metricMethods {
		if m != http.MethodOptions && mux.Match(chi.NewRouteContext(), m, path) {
			allowed = append(allowed, m)
			if m == http.MethodGet {
				allowed = append(allowed, http.MethodHead) // answered by the GET route
			}
		}
	}
	if len(allowed) == 0 {
		problem.Write(w, problem.New(problem.NotFound, "no route for %s", r.URL.Path))
		return
	}
	w.Header().Set("Allow", strings.Join(allowed, ", "))
	e := problem.New(problem.InvalidRequest, "method %q is not allowed on %s; allowed: %s", r.Method, r.URL.Path, strings.Join(allowed, ", "))
	e.HTTPStatus = http.StatusMethodNotAllowed
	problem.Write(w, e)
}

// PathParam is the path parameter name as the client meant it, decoded
// exactly once. chi matches on the request's escaped path when it has one
// (r.URL.RawPath: the client escaped a byte the default encoding would
// not, as encodeURIComponent does with ':') and then hands the parameter
// over as sent (payout%3Aacc-1); otherwise on the decoded path, so the
// parameter is decoded already and must not be decoded again (a%2541 is
// the id "a%41", never "aA"). A parameter that does not decode is given
// as sent, for the caller's validation to refuse.
func PathParam(r *http.Request, name string) string {
	v := chi.URLParam(r, name)
	if r.URL.RawPath == "" {
		return v
	}
	if d, err := url.PathUnescape(v); err == nil {
		return d
	}
	return v
}

// routePath is the path chi matches a request on: the escaped one when the
// request has one.
func routePath(r *http.Request) string {
	if r.URL.RawPath != "" {
		return r.URL.RawPath
	}
	return r.URL.Path
}
