package reconcile

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
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

// SaveState writes the state file atomically (temp file, fsync, rename,
// fsync of the directory).
func SaveState(path string, st State) error {
	commit, err := prepareState(path, st)
	if err != nil {
		return err
	}
	return commit(true)
}

// prepareState writes st to a temporary file beside path and syncs it;
// commit(true) renames it over path and syncs the directory, commit(false)
// removes it. Between the two a run can do what must happen before the
// state moves on (the metrics file that carries the safety events the
// state will no longer report).
func prepareState(path string, st State) (commit func(keep bool) error, err error) {
	b, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return nil, err
	}
	return prepareFile("--state-file", path, 0o600, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// syncFile syncs a file written by prepareFile, or the directory of its
// rename (a variable for tests that see what is synced).
var syncFile = (*os.File).Sync

// prepareFile writes a file of the given mode durably (flag names it in
// errors): write fills a temporary file beside path, which is synced;
// commit(true) renames it over path and syncs the directory, so that the
// file survives a crash of the host once commit returns; commit(false)
// removes it.
func prepareFile(flag, path string, mode os.FileMode, write func(io.Writer) error) (commit func(keep bool) error, err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return nil, fmt.Errorf("write %s: %w", flag, err)
	}
	name := tmp.Name()
	err = tmp.Chmod(mode)
	if err == nil {
		err = write(tmp)
	}
	if err == nil {
		err = syncFile(tmp)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(name)
		return nil, fmt.Errorf("write %s: %w", flag, err)
	}
	return func(keep bool) error {
		if !keep {
			return os.Remove(name)
		}
		if err := os.Rename(name, path); err != nil {
			os.Remove(name)
			return fmt.Errorf("write %s: %w", flag, err)
		}
		// The rename itself survives a crash of the host only once the
		// directory is synced.
		if d, err := os.Open(filepath.Dir(path)); err == nil {
			err = syncFile(d)
			d.Close()
			if err != nil {
				return fmt.Errorf("write %s: sync its directory: %w", flag, err)
			}
		}
		return nil
	}, nil
}
