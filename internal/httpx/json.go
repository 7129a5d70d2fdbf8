package httpx

import (
	"bytes"
	"encoding/json"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/payouts/payouts/internal/problem"
	"github.com/payouts/payouts/internal/strictjson"
)

// MaxBodyBytes is the largest request body any server accepts.
const MaxBodyBytes = 1 << 20

// DecodeJSON strictly decodes the request body into v: unknown fields,
// trailing data, wrong types, empty bodies and bodies over 1 MiB are
// invalid_request errors naming what was wrong. A Content-Type, when
// given, must be application/json, in UTF-8 if it names a charset.
func DecodeJSON(r *http.Request, v any) error {
	if err := CheckContentType(r); err != nil {
		return err
	}
	body, err := ReadBody(r)
	if err != nil {
		return err
	}
	return DecodeStrict(body, v)
}

// CheckContentType refuses (invalid_request) a request whose Content-Type
// is given and is not application/json (charset utf-8, if any): the rule
// of every JSON body, for a handler that reads its body itself.
func CheckContentType(r *http.Request) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !jsonContentType(ct) {
		return problem.New(problem.InvalidRequest, "Content-Type must be application/json (charset utf-8, if any), got %q", problem.Echo(ct))
	}
	return nil
}

// DecodeEmpty accepts a request body that is empty (or only white space)
// or the empty JSON object {}, for a request that carries nothing, and
// refuses anything else as invalid_request: a body is held to the rules of
// every other body (DecodeJSON), its Content-Type included, while an empty
// body has nothing for a Content-Type to describe and passes with any.
func DecodeEmpty(r *http.Request) error {
	body, err := ReadBody(r)
	if err != nil {
		return err
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return nil
	}
	if err := CheckContentType(r); err != nil {
		return err
	}
	if body[0] != '{' {
		return problem.New(problem.InvalidRequest, "the body must be empty or {}")
	}
	var empty struct{}
	if err := DecodeStrict(body, &empty); err != nil {
		// A member ({"ttl_ms":60000}) is an unknown field, named as such
		// in the problem's field member.
		e := problem.From(err)
		e.Message = "the body must be empty or {}: " + e.Message
		return e
	}
	return nil
}

// ReadBody reads the request body whole: a body over MaxBodyBytes is 413,
// one that cannot be read an invalid_request.
func ReadBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBodyBytes+1))
	if err != nil {
		return nil, problem.Wrap(problem.InvalidRequest, err, "could not read the request body")
	}
	if len(body) > MaxBodyBytes {
		e := problem.New(problem.InvalidRequest, "request body is larger than %d bytes", MaxBodyBytes)
		e.HTTPStatus = http.StatusRequestEntityTooLarge
		return nil, e
	}
	return body, nil
}

// DecodeStrict is DecodeJSON's rules applied to bytes (strictjson.Decode).
func DecodeStrict(body []byte, v any) error { return strictjson.Decode(body, v) }

// WriteJSON writes v with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		problem.Write(w, problem.Wrap(problem.Internal, err, "could not encode the response"))
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// jsonContentType reports whether ct is application/json, with no
// parameter but a UTF-8 charset: JSON is UTF-8 (RFC 8259), and a body
// declared otherwise would be read as something it is not.
func jsonContentType(ct string) bool {
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil || mt != "application/json" {
		return false
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return false
		}
	}
	return true
}
