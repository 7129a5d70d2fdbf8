package strictjson

import (
	"encoding/json"
	"io"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/payouts/payouts/internal/problem"
)

// checkFieldNames refuses object keys that name a field of t only when
// compared case-insensitively (encoding/json accepts {"ID":...} for a field
// tagged "id"): field names must match exactly. It also refuses a key
// given twice in one object, which encoding/json takes silently (the last
// wins): {"amount":5,...,"amount":999999} reads as one amount to one parser
// and as another to the next (a log, a proxy, an audit copy of the body). It descends into struct,
// pointer, slice, array and map values; body has already been decoded into
// a value of type t, so it is well-formed JSON. It reads body once, in
// one walk that decodes nothing but the keys (a walk that unmarshalled each
// level into a map of raw values read a list's items once per level above
// them, and cost more than the decode it checks).
func checkFieldNames(body []byte, t reflect.Type) error {
	w := fieldWalk{b: body, end: -1}
	w.path = w.pathBuf[:0]
	return w.value(t)
}

// fieldAt is the path (items[3].payout_id) of the innermost value of body
// that holds byte end (the byte before it), where encoding/json reports a
// value of the wrong type ("" when none does): its own Field names the path without the
// items' indexes (items.payout_id).
func fieldAt(body []byte, t reflect.Type, end int64) string {
	w := fieldWalk{b: body, end: int(end)}
	w.path = w.pathBuf[:0]
	_ = w.value(t)
	return w.found
}

// fieldWalk is checkFieldNames' position in the body and the path to it.
type fieldWalk struct {
	b       []byte
	i       int
	path    []pathSeg
	pathBuf [8]pathSeg // path's first steps, without an allocation
	// end, when not -1, is where a value fieldAt looks for ends; found is
	// its path.
	end   int
	found string
}

// pathSeg is one step of a path: an object's key, or an array's index
// when key is "".
type pathSeg struct {
	key string
	idx int
}

// field is the path to key in the object being walked, as a problem's
// field member names it: items[3].payout_id; a top-level key is itself.
func (w *fieldWalk) field(key string) string {
	if len(w.path) == 0 {
		return key
	}
	var b strings.Builder
	for i, s := range w.path {
		if s.key == "" {
			b.WriteByte('[')
			b.WriteString(strconv.Itoa(s.idx))
			b.WriteByte(']')
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(s.key)
	}
	if key != "" {
		b.WriteByte('.')
		b.WriteString(key)
	}
	return b.String()
}

func (w *fieldWalk) peek() byte {
	for w.i < len(w.b) {
		switch c := w.b[w.i]; c {
		case ' ', '\t', '\r', '\n':
			w.i++
		default:
			return c
		}
	}
	return 0
}

// value walks one value that decodes into t (nil: not checked).
func (w *fieldWalk) value(t reflect.Type) error {
	if w.end < 0 {
		return w.walk(t)
	}
	w.peek()
	start := w.i
	err := w.walk(t)
	// Inner values end first: the first to hold w.end is the innermost.
	if w.found == "" && start < w.end && w.end <= w.i {
		w.found = w.field("")
	}
	return err
}

// walk is value's walk.
func (w *fieldWalk) walk(t reflect.Type) error {
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch w.peek() {
	case '{':
		var fields map[string]reflect.Type
		var elem reflect.Type
		if t != nil {
			switch t.Kind() {
			case reflect.Struct:
				fields = fieldsOf(t)
			case reflect.Map:
				elem = t.Elem()
			}
		}
		w.i++
		var seen keySet
		for {
			switch w.peek() {
			case '}':
				w.i++
				return nil
			case ',':
				w.i++
				continue
			case '"':
			default:
				return nil // not well-formed: the decoder has judged it
			}
			key, err := w.str()
			if err != nil {
				return nil
			}
			if w.peek() != ':' {
				return nil
			}
			w.i++
			if !seen.add(key) {
				f := w.field(key)
				return problem.New(problem.InvalidRequest, "field %q is given twice", f).With("field", problem.Echo(f))
			}
			ft := elem
			if fields != nil {
				f, ok := fields[key]
				if !ok {
					f := w.field(key)
					return problem.New(problem.InvalidRequest, "unknown field %q (field names are case-sensitive)", f).With("field", problem.Echo(f))
				}
				ft = f
			}
			at := w.i
			w.path = append(w.path, pathSeg{key: key})
			err = w.value(ft)
			w.path = w.path[:len(w.path)-1]
			if err != nil || w.i == at {
				return err
			}
		}
	case '[':
		var elem reflect.Type
		if t != nil && (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) {
			elem = t.Elem()
		}
		w.i++
		for n := 0; ; {
			switch w.peek() {
			case ']':
				w.i++
				return nil
			case ',':
				w.i++
			case 0:
				return nil
			default:
				at := w.i
				w.path = append(w.path, pathSeg{idx: n})
				err := w.value(elem)
				w.path = w.path[:len(w.path)-1]
				if err != nil || w.i == at {
					return err // w.i == at: not well-formed, judged by the decoder
				}
				n++
			}
		}
	case '"':
		_, err := w.str()
		return err
	default: // a number, true, false or null
		for w.i < len(w.b) {
			switch w.b[w.i] {
			case ',', ']', '}', ' ', '\t', '\r', '\n':
				return nil
			}
			w.i++
		}
	}
	return nil
}

// keySet is the keys of one object seen so far: a short list while the
// object is small (request objects have a handful of keys), a map once it
// is not, so a body of many keys is not read quadratically.
type keySet struct {
	list [16]string
	n    int
	m    map[string]struct{}
}

// add records key and reports whether it was new.
func (k *keySet) add(key string) bool {
	if k.m != nil {
		if _, dup := k.m[key]; dup {
			return false
		}
		k.m[key] = struct{}{}
		return true
	}
	for _, s := range k.list[:k.n] {
		if s == key {
			return false
		}
	}
	if k.n < len(k.list) {
		k.list[k.n] = key
		k.n++
		return true
	}
	k.m = make(map[string]struct{}, 2*k.n)
	for _, s := range k.list[:k.n] {
		k.m[s] = struct{}{}
	}
	k.m[key] = struct{}{}
	return true
}

// str reads the string at w.i, unescaped.
func (w *fieldWalk) str() (string, error) {
	start, escaped := w.i, false
	for w.i++; w.i < len(w.b); w.i++ {
		switch w.b[w.i] {
		case '\\':
			escaped = true
			w.i++
		case '"':
			w.i++
			if !escaped {
				return string(w.b[start+1 : w.i-1]), nil
			}
			var s string
			err := json.Unmarshal(w.b[start:w.i], &s)
			return s, err
		}
	}
	return "", io.ErrUnexpectedEOF
}

// fieldNames caches jsonFields by type: a request body's every object
// would otherwise rebuild its type's map by reflection.
var fieldNames sync.Map // reflect.Type -> map[string]reflect.Type

func fieldsOf(t reflect.Type) map[string]reflect.Type {
	if f, ok := fieldNames.Load(t); ok {
		return f.(map[string]reflect.Type)
	}
	f, _ := fieldNames.LoadOrStore(t, jsonFields(t))
	return f.(map[string]reflect.Type)
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
