package lockclient

import (
	"time"

	"github.com/payouts/payouts/lock/fencing"
)

// Wire types of the lock service's HTTP API (DESIGN §4). The server
// encodes exactly these.

// CreateSessionRequest is the body of POST /v1/sessions.
type CreateSessionRequest struct {
	Owner string `json:"owner"`
	TTLMS int64  `json:"ttl_ms"`
}

// SessionInfo is a session as the service reports it: the answer to POST
// /v1/sessions, POST /v1/sessions/{id}/keepalive, DELETE and GET
// /v1/sessions/{id}. State is ACTIVE, SUSPECT, EXPIRED or CLOSED. The
// heartbeat and expiry are always present, null when the service no longer
// knows them (an ended session on the etcd backend).
type SessionInfo struct {
	SessionID       string     `json:"session_id"`
	Owner           string     `json:"owner"`
	TTLMS           int64      `json:"ttl_ms"`
	State           string     `json:"state"`
	CreatedAt       *time.Time `json:"created_at,omitempty"`
	LastHeartbeatAt *time.Time `json:"last_heartbeat_at"`
	ExpiresAt       *time.Time `json:"expires_at"`
}

// AcquireRequest is the body of POST /v1/locks/{key}/acquire. WaitMS 0
// answers at once; otherwise the service waits up to WaitMS for the key.
type AcquireRequest struct {
	SessionID string `json:"session_id"`
	WaitMS    int64  `json:"wait_ms,omitempty"`
}

// GrantInfo is a successful acquire.
type GrantInfo struct {
	Key          string        `json:"key"`
	Owner        string        `json:"owner"`
	Token        fencing.Token `json:"token"`
	SessionID    string        `json:"session_id"`
	ServerExpiry time.Time     `json:"server_expiry"`
}

// ReleaseRequest is the body of POST /v1/locks/{key}/release.
type ReleaseRequest struct {
	SessionID string        `json:"session_id"`
	Token     fencing.Token `json:"token"`
}

// RevokeRequest is the body of POST /v1/locks/{key}/revoke (operator).
type RevokeRequest struct {
	Reason string `json:"reason"`
}

// LockInfo is GET /v1/locks/{key}: introspection only, never a correctness
// input (it may be false by the time it is read).
type LockInfo struct {
	Key          string        `json:"key"`
	Held         bool          `json:"held"`
	Owner        string        `json:"owner,omitempty"`
	SessionID    string        `json:"session_id,omitempty"`
	Token        fencing.Token `json:"token,omitempty"`
	AcquiredAt   *time.Time    `json:"acquired_at,omitempty"`
	ServerExpiry *time.Time    `json:"server_expiry,omitempty"`
	// Waiters is the number of waiting acquires on the answering process.
	Waiters int `json:"waiters"`
}

// LockList is GET /v1/locks?prefix=.
type LockList struct {
	Items []LockInfo `json:"items"`
}

// GrantRecord is one entry of the grant log (D-9). EndReason is released,
// expired or revoked; empty (and EndedAt nil) while the grant is held.
type GrantRecord struct {
	Token     fencing.Token `json:"token"`
	Key       string        `json:"key"`
	Owner     string        `json:"owner"`
	SessionID string        `json:"session_id"`
	GrantedAt time.Time     `json:"granted_at"`
	EndedAt   *time.Time    `json:"ended_at"`
	EndReason *string       `json:"end_reason"`
	Actor     string        `json:"actor,omitempty"`
	Reason    string        `json:"reason,omitempty"`
}

// Holder is the grant's holder identity as the guards see it.
func (r GrantRecord) Holder() fencing.Holder { return fencing.Holder(r.SessionID) }

// GrantPage is GET /v1/grants. Next is the after_token of the next page, or
// empty when this page is the last.
type GrantPage struct {
	Items []GrantRecord `json:"items"`
	Next  string        `json:"next"`
}

// HighTokenResponse is GET /v1/tokens/high.
type HighTokenResponse struct {
	Token fencing.Token `json:"token"`
}
