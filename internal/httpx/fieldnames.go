package httpx

import (
	"encoding/json"
	"reflect"
	"strings"

	"github.com/payouts/payouts/internal/problem"
)

// checkFieldNames refuses object keys that name a field of t only when
// compared case-insensitively (encoding/json accepts {"ID":...} for a field
// tagged "id"): field names must match exactly. It descends into struct,
// pointer, slice, array and map values; body has already been decoded into
// a value of type t, so it is well-formed JSON.
func checkFieldNames(body []byte, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(body, &obj) != nil || obj == nil {
			return nil // not an object (null): the decoder already judged it
		}
		fields := jsonFields(t)
		for k, v := range obj {
			ft, ok := fields[k]
			if !ok {
				return problem.New(problem.InvalidRequest, "unknown field %q (field names are case-sensitive)", k)
			}
			if err := checkFieldNames(v, ft); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		var items []json.RawMessage
		if json.Unmarshal(body, &items) != nil {
			return nil
		}
		for _, v := range items {
			if err := checkFieldNames(v, t.Elem()); err != nil {
				return err
			}
		}
	case reflect.Map:
		var obj map[string]json.RawMessage
		if json.Unmarshal(body, &obj) != nil {
			return nil
		}
		for _, v := range obj {
			if err := checkFieldNames(v, t.Elem()); err != nil {
				return err
			}
		}
	}
	return nil
}

// jsonFields maps each JSON name of struct type t (embedded structs
// flattened) to its field's type.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for k, v := range jsonFields(ft) {
					if _, ok := out[k]; !ok {
						out[k] = v
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}
