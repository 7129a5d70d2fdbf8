// Package fuzzhttp sends fuzzed requests to a running server and checks
// the answer against DESIGN §5 "Bad input": a 2xx, or a 4xx that is an
// application/problem+json document with a stable code; never a 5xx.
package fuzzhttp

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/payouts/payouts/internal/problem"
)

// Client is an HTTP client for fuzzing one server.
var Client = &http.Client{Timeout: time.Minute}

// Answer is what the server said.
type Answer struct {
	Status int
	Code   problem.Code // "" on a 2xx
	Body   []byte
}

// OK reports a 2xx answer.
func (a Answer) OK() bool { return a.Status >= 200 && a.Status < 300 }

// Do sends method url with body and bearer token, and fails t unless the
// answer is a 2xx, or a 4xx problem document whose status matches its code.
func Do(t testing.TB, method, url, token string, body []byte) Answer {
	t.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		t.Fatalf("build request: %v", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := Client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read body: %v", method, url, err)
	}
	a := Answer{Status: resp.StatusCode, Body: raw}
	switch {
	case a.OK():
		return a
	case resp.StatusCode < 400 || resp.StatusCode >= 500:
		t.Fatalf("%s %s with body %q: status %d, want 2xx or 4xx\n%s", method, url, body, resp.StatusCode, raw)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, problem.ContentType) {
		t.Fatalf("%s %s with body %q: %d with Content-Type %q, want %s\n%s", method, url, body, resp.StatusCode, ct, problem.ContentType, raw)
	}
	var doc struct {
		Code   problem.Code `json:"code"`
		Status int          `json:"status"`
		Detail string       `json:"detail"`
	}
	if err := json.Unmarshal(raw, &doc); err != nil {
		t.Fatalf("%s %s with body %q: %d body is not JSON: %v\n%s", method, url, body, resp.StatusCode, err, raw)
	}
	known := false
	for _, c := range problem.Codes() {
		known = known || c == doc.Code
	}
	if !known || doc.Status != resp.StatusCode || problem.Status(doc.Code) != resp.StatusCode || doc.Detail == "" {
		t.Fatalf("%s %s with body %q: %d problem document with code %q, status %d, detail %q: want a stable code matching the status and a detail",
			method, url, body, resp.StatusCode, doc.Code, doc.Status, doc.Detail)
	}
	a.Code = doc.Code
	return a
}
