package wire

import (
	"regexp"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/payouts/payouts/lock/fencing"
)

// Field limits: the one definition every server checks its input against.
// The rail proxy and the rail stub apply the same limits as the payment
// resource, so a payout the payment resource accepts at creation can always
// be forwarded.
const (
	// MaxIDLen bounds account and payout ids (IDPattern).
	MaxIDLen = 128
	// MaxRefLen bounds beneficiary, rail and client references and error codes.
	MaxRefLen = 200
	// MaxHolderLen bounds a grant's holder (its session id).
	MaxHolderLen = 256
	// MaxTextLen bounds free text: reasons and evidence.
	MaxTextLen = 4096
	// MaxAmount is the exclusive upper bound of an amount in minor units (D-14).
	MaxAmount int64 = 1_000_000_000_000_000
)

// IDPattern is what account and payout ids look like: they travel in URL
// paths and in the lock key payout:{account_id}.
var IDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CurrencyPattern is an ISO 4217 code.
var CurrencyPattern = regexp.MustCompile(`^[A-Z]{3}$`)

// ClientRefPrefix is the fixed prefix of every client reference (D-10):
// client_ref = ClientRefPrefix + payout id, never regenerated.
const ClientRefPrefix = "po-"

// ClientRef is the client reference the rail sees for a payout.
func ClientRef(payoutID string) string { return ClientRefPrefix + payoutID }

// ValidID checks a required account or payout id.
func ValidID(field, v string) error {
	if v == "" {
		return BadField(field, "required")
	}
	if !IDPattern.MatchString(v) {
		return BadField(field, "must be 1-%d characters of A-Z a-z 0-9 . _ - starting with a letter or digit", MaxIDLen)
	}
	return nil
}

// ValidText checks a free-text field: bounded length, never a NUL
// (PostgreSQL text cannot hold one) nor invalid UTF-8, and no control
// characters in one-line fields.
func ValidText(field, v string, maxLen int, required, oneLine bool) error {
	if strings.TrimSpace(v) == "" {
		if required {
			return BadField(field, "required and must not be blank")
		}
		if v != "" {
			return BadField(field, "must not be blank")
		}
		return nil
	}
	if len(v) > maxLen {
		return BadField(field, "longer than %d bytes", maxLen)
	}
	for _, r := range v {
		// Free text keeps its line breaks and tabs, and no other control
		// character: an escape sequence would rewrite the terminal of the
		// operator who reads it (payouts payout show --events). A one-line
		// field (a reference, an id the rail and operators read) also
		// refuses those and format characters (Cf): a right-to-left
		// override or a zero-width space makes one text read as another.
		if r == 0 || r == unicode.ReplacementChar ||
			(unicode.IsControl(r) && (oneLine || (r != '\n' && r != '\t' && r != '\r'))) ||
			(oneLine && unicode.Is(unicode.Cf, r)) {
			return BadField(field, "contains a control, format or invalid character")
		}
	}
	return nil
}

// OneLine makes text that comes from outside the system (a rail's
// reference or decline code) fit a one-line field ValidText accepts: every
// NUL, control, format or invalid character becomes '?', and the text is cut
// to at most maxLen bytes on a character boundary. Blank text becomes "".
// The original stays where it was received, as evidence.
func OneLine(v string, maxLen int) string {
	var b strings.Builder
	for _, r := range v { // invalid UTF-8 ranges as unicode.ReplacementChar
		if r == 0 || r == unicode.ReplacementChar || unicode.IsControl(r) || unicode.Is(unicode.Cf, r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > maxLen {
			break
		}
		b.WriteRune(r)
	}
	if strings.TrimSpace(b.String()) == "" {
		return ""
	}
	return b.String()
}

// ValidRef checks a required one-line reference (beneficiary_ref and the like).
func ValidRef(field, v string) error { return ValidText(field, v, MaxRefLen, true, true) }

// ValidAmount checks an amount in minor units: 0 < v < 10^15 (0 allowed
// when allowZero).
func ValidAmount(field string, v int64, allowZero bool) error {
	if v < 0 || (v == 0 && !allowZero) {
		want := "a positive"
		if allowZero {
			want = "zero or a positive"
		}
		return BadField(field, "must be %s integer number of minor units, got %d", want, v)
	}
	if v >= MaxAmount {
		return BadField(field, "must be below 10^15 minor units, got %d", v)
	}
	return nil
}

// ValidCurrency checks a required ISO 4217 code.
func ValidCurrency(field, v string) error {
	if v == "" {
		return BadField(field, "required")
	}
	if !CurrencyPattern.MatchString(v) {
		return BadField(field, "must be a three-letter upper-case ISO 4217 code, got %q", v)
	}
	return nil
}

// ValidFence checks the (token, holder) of a grant presented to a guard.
func ValidFence(token fencing.Token, holder fencing.Holder) error {
	if token == 0 {
		return BadField("token", "required: the fencing token of the caller's grant (a positive integer)")
	}
	if err := token.Check(); err != nil {
		return BadField("token", "%v", err)
	}
	if holder == "" {
		return BadField("holder", "required: the session id of the caller's grant")
	}
	return ValidText("holder", string(holder), MaxHolderLen, true, true)
}
