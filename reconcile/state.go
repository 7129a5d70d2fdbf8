package reconcile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// State is what --state-file keeps between passes: how far each guard's
// safety-event log has been reported. A safety event is evidence that a
// safety net fired; it is reported (exit 1, an alert) by the first pass that
// sees it and not again, so a cron job pages once per incident instead of on
// every run forever. The events themselves stay in the guards' tables.
type State struct {
	SafetyEventsAfter EventCursor `json:"safety_events_after"`
}

// LoadState reads the state file; a missing file is the zero state (every
// event not yet reported).
func LoadState(path string) (State, error) {
	var st State
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("read --state-file: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("read --state-file %s: %w (delete it to report every safety event again)", path, err)
	}
	if st.SafetyEventsAfter.Payment < 0 || st.SafetyEventsAfter.Proxy < 0 {
		return st, fmt.Errorf("read --state-file %s: negative cursor", path)
	}
	return st, nil
}

// SaveState writes the state file atomically (temp file, fsync, rename).
func SaveState(path string, st State) error {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".reconcile-state-*")
	if err != nil {
		return fmt.Errorf("write --state-file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(append(b, '\n')); err != nil {
		tmp.Close()
		return fmt.Errorf("write --state-file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write --state-file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write --state-file: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write --state-file: %w", err)
	}
	return nil
}
