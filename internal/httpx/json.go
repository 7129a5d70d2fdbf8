package httpx

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/payouts/payouts/internal/problem"
)

// MaxBodyBytes is the largest request body any server accepts.
const MaxBodyBytes = 1 << 20

// DecodeJSON strictly decodes the request body into v: unknown fields,
// trailing data, wrong types, empty bodies and bodies over 1 MiB are
// invalid_request errors naming what was wrong. A Content-Type, when
// given, must be application/json, in UTF-8 if it names a charset.
func DecodeJSON(r *http.Request, v any) error {
	if ct := r.Header.Get("Content-Type"); ct != "" && !jsonContentType(ct) {
		return problem.New(problem.InvalidRequest, "Content-Type must be application/json (charset utf-8, if any), got %q", problem.Echo(ct))
	}
	body, err := ReadBody(r)
	if err != nil {
		return err
	}
	return DecodeStrict(body, v)
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

// DecodeStrict is DecodeJSON's rules applied to bytes.
func DecodeStrict(body []byte, v any) error {
	if len(bytes.TrimSpace(body)) == 0 {
		return problem.New(problem.InvalidRequest, "request body is empty; a JSON object is required")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		msg, field := describeJSONError(err)
		e := problem.New(problem.InvalidRequest, "%s", msg)
		if field != "" {
			e = e.With("field", problem.Echo(field))
		}
		return e
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return problem.New(problem.InvalidRequest, "request body has data after the JSON object")
	}
	return checkFieldNames(body, reflect.TypeOf(v))
}

// describeJSONError says what was wrong with a body and, when one field
// was, which (the problem's field member).
func describeJSONError(err error) (msg, field string) {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return fmt.Sprintf("malformed JSON at byte %d: %v", syn.Offset, syn), ""
	case errors.As(err, &typ):
		if typ.Field == "" {
			return fmt.Sprintf("body must be %s, not %s", jsonKind(typ.Type.Kind().String()), typ.Value), ""
		}
		return fmt.Sprintf("field %q must be %s, not %s", typ.Field, jsonKind(typ.Type.Kind().String()), typ.Value), typ.Field
	case errors.Is(err, io.ErrUnexpectedEOF):
		return "malformed JSON: unexpected end of body", ""
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		if n, err := strconv.Unquote(name); err == nil {
			return "unknown field " + name, n
		}
		return "unknown field " + name, strings.Trim(name, `"`)
	default:
		return "malformed JSON: " + err.Error(), ""
	}
}

func jsonKind(k string) string {
	switch k {
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return "an integer"
	case "float32", "float64":
		return "a number"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return k
}

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
