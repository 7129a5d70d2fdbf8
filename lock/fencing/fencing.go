// Package fencing defines the fencing token: the one integer that crosses
// every trust boundary. It is defined once here and used by every client
// package, so a mutating call cannot be written without one.
package fencing

import (
	"fmt"
	"strconv"
)

// Token is a fencing token: a positive integer, strictly increasing per lock
// key across every grant the lock service ever makes (INV-04). Guards accept
// a write only when its token is above the highest they have seen, or equal
// to it from the same holder (DESIGN D-1).
type Token int64

// MaxToken keeps tokens exact as JSON numbers (below 2^53).
const MaxToken Token = 1<<53 - 1

// Valid reports whether t could have been issued by the lock service.
func (t Token) Valid() bool { return t > 0 && t <= MaxToken }

func (t Token) String() string { return strconv.FormatInt(int64(t), 10) }

// Holder identifies the grant a token belongs to: the lock session id.
// An equal token with a different holder means a token was re-issued.
type Holder string

// Check returns an error when t cannot be a real token.
func (t Token) Check() error {
	if !t.Valid() {
		return fmt.Errorf("fencing token %d is not a positive integer below 2^53", int64(t))
	}
	return nil
}

// Key is the lock key of an account's payouts (DESIGN D-3).
func Key(accountID string) string { return "payout:" + accountID }
