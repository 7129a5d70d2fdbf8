// Package querytest checks a server's reads against the query rule every
// role shares (internal/wire.Query): a GET refuses a query parameter it
// does not take, and one given more than once, with 400 invalid_request
// naming the parameter in the problem's field member.
package querytest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

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
				if status, body := get(t, baseURL+rd.Path, q, bearer); status/100 != 2 {
					t.Fatalf("GET %s?%s: %d %s; want 2xx (values the read takes)", rd.Path, q, status, body)
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
				status, body := get(t, baseURL+rd.Path, c.query, bearer)
				var pb struct {
					Code  problem.Code `json:"code"`
					Field *string      `json:"field"`
				}
				_ = json.Unmarshal(body, &pb)
				if status != http.StatusBadRequest || pb.Code != problem.InvalidRequest || pb.Field == nil || *pb.Field != c.field {
					t.Errorf("GET %s?%s: %d %s; want 400 invalid_request with field %q", rd.Path, c.query, status, body, c.field)
				}
			}
		})
	}
}

func get(t *testing.T, url, query, bearer string) (int, []byte) {
	t.Helper()
	if query != "" {
		url += "?" + query
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+bearer)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, body
}
