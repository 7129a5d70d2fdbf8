// Package querytest checks a server's reads against the query rule every
// role shares (internal/wire.Query): a GET refuses a query parameter it
// does not take, and one given more than once, with 400 invalid_request
// naming the parameter in the problem's field member.
package querytest

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/payouts/payouts/dev/fuzzhttp"
	"github.com/payouts/payouts/internal/problem"
)

// Param is a query parameter a read takes, with two values it accepts
// each on its own.
type Param struct {
	Name string
	A, B string
}

// Read is one GET endpoint (a path, naming something that exists where the
// read needs it) and every query parameter it takes.
type Read struct {
	Path   string
	Params []Param
	// Repeatable are parameters it takes any number of times (not checked
	// for repetition).
	Repeatable []Param
}

// unknown is a typo of limit: a parameter no read takes.
const unknown = "limt"

// Check sends, for each read, with bearer: every parameter once with its
// value A, then with B (both must answer 2xx: the refusals below are about
// the query's shape, not its values); then an unknown parameter, alone and
// after the others, and each parameter twice, separated by & and by ;
// (each must answer 400 invalid_request naming the parameter in field).
func Check(t *testing.T, baseURL, bearer string, reads []Read) {
	t.Helper()
	for _, rd := range reads {
		t.Run(rd.Path, func(t *testing.T) {
			var as, bs []string
			for _, p := range rd.Params {
				as, bs = append(as, p.Name+"="+p.A), append(bs, p.Name+"="+p.B)
			}
			for _, p := range rd.Repeatable {
				as, bs = append(as, p.Name+"="+p.A, p.Name+"="+p.B), append(bs, p.Name+"="+p.B)
			}
			all := strings.Join(as, "&")
			for _, q := range []string{all, strings.Join(bs, "&")} {
				if a := get(t, baseURL+rd.Path, q, bearer); !a.OK() {
					t.Fatalf("GET %s?%s: %d %s; want 2xx (values the read takes)", rd.Path, q, a.Status, a.Body)
				}
			}
			type bad struct{ query, field string }
			cases := []bad{{unknown + "=5", unknown}}
			if all != "" {
				cases = append(cases, bad{all + "&" + unknown + "=5", unknown})
			}
			for _, p := range rd.Params {
				cases = append(cases,
					bad{p.Name + "=" + p.A + "&" + p.Name + "=" + p.B, p.Name},
					bad{p.Name + "=" + p.A + "&" + p.Name + "=" + p.A, p.Name},
					bad{p.Name + "=" + p.A + ";" + p.Name + "=" + p.B, p.Name})
			}
			for _, c := range cases {
				a := get(t, baseURL+rd.Path, c.query, bearer)
				var pb struct {
					Field *string `json:"field"`
				}
				_ = json.Unmarshal(a.Body, &pb)
				if a.Status != http.StatusBadRequest || a.Code != problem.InvalidRequest || pb.Field == nil || *pb.Field != c.field {
					t.Errorf("GET %s?%s: %d %s; want 400 invalid_request with field %q", rd.Path, c.query, a.Status, a.Body, c.field)
				}
			}
		})
	}
}

// get sends GET url?query with bearer through fuzzhttp.Do, which also
// fails t on a 5xx or a 4xx that is not a well-formed problem document.
func get(t *testing.T, url, query, bearer string) fuzzhttp.Answer {
	t.Helper()
	if query != "" {
		url += "?" + query
	}
	return fuzzhttp.Do(t, http.MethodGet, url, bearer, nil)
}
