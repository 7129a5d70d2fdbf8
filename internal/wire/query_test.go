package wire

import (
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
)

// Query takes what net/url takes from a well-formed query, and refuses an
// unknown parameter, a repeated one and a pair net/url would have dropped,
// naming the first such parameter in the problem's field member.
func TestQueryRefusesUnknownRepeatedAndMalformedParameters(t *testing.T) {
	for _, c := range []struct {
		raw   string
		field string // "" accepted
	}{
		{"", ""},
		{"after=a&limit=5", ""},
		{"after=&limit=5", ""},
		{"after=a%2Fb&&limit=5&", ""},
		{"limt=5", "limt"},
		{"after=a&limt=5&x=1", "limt"},
		{"limit=5&limit=500", "limit"},
		{"limit=5&limit=5", "limit"},
		{"after=&after=", "after"},
		{"li%6Dit=5&limit=500", "limit"},
		{"limit=5;limit=500", "limit"},
		{"limit=5&after=%zz", "after"},
		{"lim%zzit=5", "lim%zzit"},
		{"skip=acc-1", "skip"},
	} {
		q, err := Query(c.raw, "after", "limit")
		if c.field == "" {
			want, _ := url.ParseQuery(c.raw)
			if err != nil || !reflect.DeepEqual(q, want) {
				t.Errorf("Query(%q) = %v, %v; want %v", c.raw, q, err, want)
			}
			continue
		}
		var field string
		if err == nil || problem.CodeOf(err) != problem.InvalidRequest || !problem.From(err).Extension("field", &field) || field != c.field {
			t.Errorf("Query(%q) = %v, %v; want invalid_request naming %q", c.raw, q, err, c.field)
		}
	}
	// A repeatable parameter repeats, in order; the others still may not.
	q, err := QueryRepeatable("skip=b&limit=5&skip=a", []string{"skip"}, "limit")
	if err != nil || !reflect.DeepEqual(q["skip"], []string{"b", "a"}) {
		t.Errorf("repeated skip: %v, %v", q, err)
	}
	if _, err := QueryRepeatable("skip=a&limit=5&limit=6", []string{"skip"}, "limit"); problem.CodeOf(err) != problem.InvalidRequest {
		t.Errorf("repeated limit beside skip: %v, want invalid_request", err)
	}
	// An endpoint that takes nothing says so.
	if _, err := Query("x=1"); err == nil || problem.From(err).Message != "x: unknown query parameter (this endpoint takes no query parameters)" {
		t.Errorf("Query(x=1) with no parameters: %v", err)
	}
}

// A parameter name is the caller's input: the problem repeats at most
// problem.MaxEchoArg bytes of it, in its message and in its field member,
// and never reads it as a format ("%d" in a name stays "%d").
func TestRefusedParameterNamesAreEchoedBoundedAndVerbatim(t *testing.T) {
	long := strings.Repeat("a", 3000)
	for _, raw := range []string{long + "=1", "%25d%25s=1", "limit=1&limit=2&" + long + "=1"} {
		_, err := Query(raw, "limit")
		pe, ok := err.(*problem.Error)
		if !ok {
			t.Fatalf("Query(%.40q…): %v, want a problem", raw, err)
		}
		var field string
		pe.Extension("field", &field)
		if strings.Contains(pe.Message, "%!") {
			t.Errorf("Query(%.40q…): message %q reads the caller's input as a format", raw, pe.Message)
		}
		if n := strings.Count(pe.Message, "a"); n > problem.MaxEchoArg+40 {
			t.Errorf("Query(%.40q…): message repeats %d bytes of the input, want at most about %d", raw, n, problem.MaxEchoArg)
		}
		if len(field) > problem.MaxEchoArg+40 {
			t.Errorf("Query(%.40q…): field member of %d bytes, want at most about %d", raw, len(field), problem.MaxEchoArg)
		}
	}
	_, err := Query("%25d=1", "limit")
	if pe := err.(*problem.Error); !strings.HasPrefix(pe.Message, "%d: ") {
		t.Errorf("message %q, want it to name the parameter %%d as given", pe.Message)
	}
}
