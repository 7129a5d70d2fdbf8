package httpx

import (
	"net/http"
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
	path := r.URL.RawPath
	if path == "" {
		path = r.URL.Path
	}
	var allowed []string
	for _, m := range metricMethods {
		if m != http.MethodOptions && mux.Match(chi.NewRouteContext(), m, path) {
			allowed = append(allowed, m)
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
