package wire

import (
	"strings"
	"testing"
)

// An amount's refusal says what the field takes: an opening balance may be
// zero, a payout's amount may not.
func TestValidAmountSaysWhatItTakes(t *testing.T) {
	for _, c := range []struct {
		v         int64
		allowZero bool
		want      string // "" accepted
	}{
		{0, true, ""},
		{1, false, ""},
		{-5, true, "must be zero or a positive integer"},
		{0, false, "must be a positive integer"},
		{-5, false, "must be a positive integer"},
		{MaxAmount, true, "below 10^15"},
	} {
		err := ValidAmount("amount", c.v, c.allowZero)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%d (zero allowed %v): %v", c.v, c.allowZero, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%d (zero allowed %v): %v, want %q", c.v, c.allowZero, err, c.want)
		}
	}
}

// A one-line field refuses invisible format characters as it refuses
// control characters; free text keeps them (and its newlines).
func TestOneLineFieldsRefuseFormatCharacters(t *testing.T) {
	for _, v := range []string{"acct \u202e9876", "ben\u200bref", "\ufeffref", "a\tb", "a\nb"} {
		if err := ValidRef("beneficiary_ref", v); err == nil {
			t.Errorf("ValidRef(%q) accepted a control or format character", v)
		}
	}
	if err := ValidRef("beneficiary_ref", "Zoë Ünal, IBAN DE89 3704 0044"); err != nil {
		t.Errorf("a plain reference with letters beyond ASCII was refused: %v", err)
	}
	if err := ValidText("reason", "line one\r\nline two\t\u200d", MaxTextLen, true, false); err != nil {
		t.Errorf("free text refused: %v", err)
	}
	// Free text refuses every other control character: an escape
	// sequence in a reason would rewrite the terminal that shows it.
	for _, v := range []string{"x\x1b[2Jy", "bell\a", "back\bspace", "c1 \u009b2J", "nul\x00"} {
		if err := ValidText("reason", v, MaxTextLen, true, false); err == nil {
			t.Errorf("ValidText(%q) accepted a control character in free text", v)
		}
	}
}

// What a rail sends back is made to fit a one-line field: whatever OneLine
// returns, ValidText accepts, and plain text passes unchanged.
func TestOneLineFitsWhatValidTextAccepts(t *testing.T) {
	long := strings.Repeat("é", MaxRefLen) // 2 bytes each: cut mid-character at MaxRefLen+1
	for _, v := range []string{"RR-1\r\nX-Injected: 1", "\u202eref\u200b", "a\x00b", "bad \xff\xfe utf8",
		"x" + long, long, "\t\n"} {
		got := OneLine(v, MaxRefLen)
		if err := ValidText("rail_ref", got, MaxRefLen, true, true); err != nil {
			t.Errorf("OneLine(%q) = %q, which ValidText refuses: %v", v, got, err)
		}
	}
	for _, v := range []string{"RR-000123", "Zoë Ünal", strings.Repeat("r", MaxRefLen)} {
		if got := OneLine(v, MaxRefLen); got != v {
			t.Errorf("OneLine(%q) = %q; want it unchanged", v, got)
		}
	}
	for v, want := range map[string]string{"ab\ncd": "ab?cd", "   ": "", "": ""} {
		if got := OneLine(v, MaxRefLen); got != want {
			t.Errorf("OneLine(%q) = %q; want %q", v, got, want)
		}
	}
}
