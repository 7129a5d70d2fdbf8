// Package strictjson decodes JSON documents strictly: the request bodies of
// every role and the files that configure them.
package strictjson

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strconv"
	"strings"

	"github.com/payouts/payouts/internal/problem"
)

// Decode strictly decodes body, which must be one JSON object, into v:
// an empty body, another value than an object (null included), unknown
// fields, field names that differ from the field's in case, a key given
// twice in one object, wrong types and trailing data are each an
// invalid_request problem naming what was wrong (its field member the
// field, when one was).
func Decode(body []byte, v any) error {
	trimmed := bytes.TrimSpace(body)
	if len(trimmed) == 0 {
		return problem.New(problem.InvalidRequest, "the body is empty; a JSON object is required")
	}
	if bytes.Equal(trimmed, []byte("null")) {
		// encoding/json decodes null into a struct as nothing at all.
		return problem.New(problem.InvalidRequest, "body must be an object, not null")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if isUnknownField(err) {
			// The walk names the key with its path (items[3].colour).
			if perr := checkFieldNames(body, reflect.TypeOf(v)); perr != nil {
				return perr
			}
		}
		var typ *json.UnmarshalTypeError
		if errors.As(err, &typ) && typ.Field != "" {
			if f := fieldAt(body, reflect.TypeOf(v), typ.Offset); f != "" {
				typ.Field = f
			}
		}
		msg, field := describeJSONError(err)
		e := problem.New(problem.InvalidRequest, "%s", msg)
		if field != "" {
			e = e.With("field", problem.Echo(field))
		}
		return e
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return problem.New(problem.InvalidRequest, "the body has data after the JSON object")
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
	case isUnknownField(err):
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		if n, err := strconv.Unquote(name); err == nil {
			return "unknown field " + name, n
		}
		return "unknown field " + name, strings.Trim(name, `"`)
	default:
		return "malformed JSON: " + err.Error(), ""
	}
}

// isUnknownField reports encoding/json's refusal of an unknown field.
func isUnknownField(err error) bool { return strings.HasPrefix(err.Error(), "json: unknown field ") }

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
