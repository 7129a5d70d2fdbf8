package wire

import (
	"net/url"
	"slices"
	"strings"
)

// Query reads raw, the query string of a GET to an endpoint that takes the
// parameters known, each at most once. It refuses, as 400 invalid_request
// naming the parameter in the problem's field member:
//   - a parameter the endpoint does not take (limt=5 is a typo, never a
//     request for the default page size);
//   - a parameter given more than once (limit=5&limit=500: one reader
//     takes the first, the next the last);
//   - a pair that does not decode (a bad %-escape, or a ';', which is not a
//     separator: net/url drops such a pair without a word).
//
// The first offending parameter in the order given is the one named.
// Nothing is read from the returned values that was not checked here.
func Query(raw string, known ...string) (url.Values, error) {
	return QueryRepeatable(raw, nil, known...)
}

// QueryRepeatable is Query for an endpoint that also takes the parameters
// repeatable, any number of times each (skip=acc-1&skip=acc-2).
func QueryRepeatable(raw string, repeatable []string, known ...string) (url.Values, error) {
	q := url.Values{}
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		if pair == "" {
			continue
		}
		rawKey, rawValue, _ := strings.Cut(pair, "=")
		key, err := url.QueryUnescape(rawKey)
		if err != nil {
			return nil, BadField(rawKey, "query parameter name is not correctly %%-escaped")
		}
		many := slices.Contains(repeatable, key)
		if !many && !slices.Contains(known, key) {
			return nil, BadField(key, "unknown query parameter (%s)", takes(append(slices.Clone(known), repeatable...)))
		}
		if _, seen := q[key]; seen && !many {
			return nil, BadField(key, "query parameter given more than once; give it once")
		}
		if strings.Contains(pair, ";") {
			return nil, BadField(key, "';' is not a query separator: separate parameters with '&' and escape a ';' in a value as %%3B")
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return nil, BadField(key, "query parameter value is not correctly %%-escaped")
		}
		q[key] = append(q[key], value)
	}
	return q, nil
}

// takes says which parameters an endpoint takes.
func takes(names []string) string {
	switch len(names) {
	case 0:
		return "this endpoint takes no query parameters"
	case 1:
		return "this endpoint takes only " + names[0]
	}
	return "this endpoint takes only " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
