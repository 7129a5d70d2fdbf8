package strictjson

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/payouts/payouts/internal/problem"
)

type benchItem struct {
	PayoutID string `json:"payout_id"`
	RailRef  string `json:"rail_ref,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
}

type benchBody struct {
	Token  int64       `json:"token"`
	Holder string      `json:"holder"`
	Op     string      `json:"op"`
	Items  []benchItem `json:"items"`
}

func benchBodyJSON(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"token":42,"holder":"exec-1","op":"claim","items":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"payout_id":"po-%03d","rail_ref":"r-%03d","outcome":"settled"}`, i, i)
	}
	b.WriteString(`]}`)
	return []byte(b.String())
}

// Field names are matched exactly at every depth, whichever item breaks
// the rule (named with its path), and the same type's names are judged
// alike on every request.
func TestStrictFieldNamesAtEveryDepth(t *testing.T) {
	for range 2 {
		var v benchBody
		if err := Decode(benchBodyJSON(20), &v); err != nil || len(v.Items) != 20 || v.Items[7].RailRef != "r-007" {
			t.Fatalf("a well-formed body: %v (%+v)", err, v)
		}
		bad := strings.Replace(string(benchBodyJSON(20)), `{"payout_id":"po-013"`, `{"Payout_ID":"po-013"`, 1)
		if err := Decode([]byte(bad), &v); err == nil || !strings.Contains(err.Error(), `unknown field "items[13].Payout_ID"`) {
			t.Fatalf("an item's key in another case: %v, want unknown field", err)
		}
		if err := Decode([]byte(`{"TOKEN":1,"holder":"h","op":"claim","items":[]}`), &v); err == nil || !strings.Contains(err.Error(), `unknown field "TOKEN"`) {
			t.Fatalf("a top-level key in another case: %v, want unknown field", err)
		}
	}
}

// The walk reads keys, not look-alikes: braces, quotes and escapes inside
// strings, escaped keys, maps, nulls and empty containers.
func TestStrictFieldNamesTrickyBodies(t *testing.T) {
	type inner struct {
		Name string            `json:"name"`
		Tags map[string]string `json:"tags"`
		Any  any               `json:"any"`
	}
	type outer struct {
		ID    string   `json:"id"`
		In    *inner   `json:"in"`
		List  []inner  `json:"list"`
		Extra []string `json:"extra"`
	}
	for _, c := range []struct {
		body, bad string
	}{
		{`{"id":"a}\"b{[","in":{"name":"x","tags":{"Any":"k","NAME":"v"}},"list":[],"extra":["}",""]}`, ""},
		{`{"\u0069d":"escaped key","in":null,"list":[{"name":"n","any":{"Whatever":[1,{"X":2}]}}]}`, ""},
		{` { "id" : "spaces" , "list" : [ { "name" : "n" } , { "tags" : { } } ] } `, ""},
		{`{"id":"x","list":[{"name":"n"},{"Name":"n2"}]}`, "list[1].Name"},
		{`{"I\u0044":"escaped, wrong case"}`, "ID"},
		{`{"id":"x","in":{"name":"x","tags":null,"ANY":1}}`, "in.ANY"},
	} {
		var v outer
		err := Decode([]byte(c.body), &v)
		switch {
		case c.bad == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("unknown field %q", c.bad))):
			t.Errorf("%s: %v, want unknown field %q", c.body, err, c.bad)
		}
	}
}

func BenchmarkDecode(b *testing.B) {
	body := benchBodyJSON(50)
	b.ReportAllocs()
	for b.Loop() {
		var v benchBody
		if err := Decode(body, &v); err != nil {
			b.Fatal(err)
		}
	}
}

// The walk assumes a body the decoder accepted, but ends on any bytes.
func FuzzCheckFieldNames(f *testing.F) {
	f.Add([]byte(`{"token":1,"items":[{"payout_id":"p"}]}`))
	f.Add([]byte(`[}`))
	f.Add([]byte(`{"a":}`))
	f.Add([]byte(`{"items":[{"payout_id":"\`))
	f.Fuzz(func(t *testing.T, body []byte) {
		_ = checkFieldNames(body, reflect.TypeOf(&benchBody{}))
	})
}

// A key given twice in one object is refused at every depth, escaped or
// not, in maps too and in objects of more keys than the short list holds;
// the same key in two different objects is no duplicate.
func TestDuplicateKeysRefused(t *testing.T) {
	type inner struct {
		Name string         `json:"name"`
		Tags map[string]int `json:"tags"`
	}
	type outer struct {
		Amount int64   `json:"amount"`
		ID     string  `json:"id"`
		List   []inner `json:"list"`
		In     *inner  `json:"in"`
		Any    any     `json:"any"`
	}
	many := func(dup bool) string {
		var b strings.Builder
		b.WriteString(`{"tags":{`)
		for i := range 40 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"k%d":%d`, i, i)
		}
		if dup {
			b.WriteString(`,"k3":0`)
		}
		b.WriteString(`}}`)
		return `{"in":` + b.String() + `}`
	}
	for _, c := range []struct {
		body, dup string
	}{
		{`{"id":"p-x","amount":5,"amount":999999}`, "amount"},
		{`{"amount":5,"\u0061mount":6}`, "amount"},
		{`{"list":[{"name":"a"},{"name":"b","name":"c"}]}`, "list[1].name"},
		{`{"in":{"tags":{"a":1,"a":2}}}`, "in.tags.a"},
		{`{"any":{"x":1,"x":2}}`, "any.x"},
		{many(true), "in.tags.k3"},
		{many(false), ""},
		{`{"list":[{"name":"a"},{"name":"b"}],"in":{"name":"c"},"id":"name"}`, ""},
	} {
		var v outer
		err := Decode([]byte(c.body), &v)
		switch {
		case c.dup == "" && err != nil:
			t.Errorf("%s: %v", c.body, err)
		case c.dup != "" && (err == nil || !strings.Contains(err.Error(), fmt.Sprintf("field %q is given twice", c.dup))):
			t.Errorf("%s: %v, want field %q given twice", c.body, err, c.dup)
		}
	}
}

// A body must be one JSON object: null, which encoding/json decodes into
// a struct as nothing at all, and any other value are refused, as an
// empty body is.
func TestOnlyAnObjectDecodes(t *testing.T) {
	for _, body := range []string{`null`, ` null `, `[]`, `"x"`, `1`, `true`, ``, `  `} {
		var v struct {
			A int `json:"a"`
		}
		if err := Decode([]byte(body), &v); err == nil || !strings.Contains(err.Error(), "object") {
			t.Errorf("%q: %v, want refused as not a JSON object", body, err)
		}
	}
	var v struct {
		A int `json:"a"`
	}
	if err := Decode([]byte(" {\"a\":1}\n"), &v); err != nil || v.A != 1 {
		t.Errorf("an object: %v %+v", err, v)
	}
}

// A refusal inside a list names the item as api.md says (items[3].outcome):
// a wrong type, an unknown field and a key given twice alike. encoding/json
// names a wrong type's field without the index (items.payout_id), and an
// unknown or repeated key was named alone (payout_id).
func TestRefusalsInAListNameTheItem(t *testing.T) {
	for _, c := range []struct{ body, field, msg string }{
		{`{"token":1,"items":[{"payout_id":"a"},{"payout_id":5}]}`, "items[1].payout_id", "must be a string"},
		{`{"token":1,"items":[{"payout_id":"a"},{"payout_id":"b"},{"outcome":["x"]}]}`, "items[2].outcome", "must be a string"},
		{`{"token":"one","items":[]}`, "token", "must be an integer"},
		{`{"token":1,"items":[{"payout_id":"a","colour":1}]}`, "items[0].colour", "unknown field"},
		{`{"token":1,"items":[{"payout_id":"a"},{"payout_id":"b","payout_id":"b"}]}`, "items[1].payout_id", "given twice"},
		{`{"token":1,"items":[{"payout_id":"a"}],"extra":1}`, "extra", "unknown field"},
	} {
		var v benchBody
		err := Decode([]byte(c.body), &v)
		var field string
		if err == nil || !problem.From(err).Extension("field", &field) || field != c.field || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v (field %q), want %s naming %s", c.body, err, field, c.msg, c.field)
		}
	}
}
