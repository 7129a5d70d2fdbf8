package rail

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"syscall"

	"github.com/payouts/payouts/rail/railclient"
)

// journal is the rail stub's state file (Config.StateFile): one JSON line
// per accepted payment, written before the payment is answered and read
// back when the stub starts. A real rail remembers what it paid across its
// own restarts; without the file the stub forgets, and a stack whose
// databases are kept (dev up) would then show every earlier payout as
// posted but never settled.
//
// Lines are appended without fsync: the file survives the stub's crash,
// which is what a stand-in needs, not the machine's.
type journal struct {
	f    *os.File
	path string
	size int64 // bytes of complete lines
}

// openJournal opens path (creating it, 0600) and returns the payments it
// holds, in the order accepted. A last line without its newline is a write
// cut short (the payment was never answered): it is dropped and the file
// cut back to its last complete line. Any other line that is not a payment
// is an error: the file is not this stub's, or was damaged.
func openJournal(path string, log *slog.Logger) (*journal, []railclient.Payment, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("state file: %w", err)
	}
	// One writer: a second stub on the same file (or a restart while the
	// old process still finishes its requests) would write over its lines.
	// The lock goes with the process.
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("state file %s is in use by another rail stub process (%w): each stub needs a file of its own", path, err)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("state file %s: %w", path, err)
	}
	var (
		ps   []railclient.Payment
		good int
	)
	for line := 1; good < len(data); line++ {
		nl := bytes.IndexByte(data[good:], '\n')
		if nl < 0 {
			log.Warn("rail state file: dropping an incomplete last line (a payment never answered)", "file", path, "line", line, "bytes", len(data)-good)
			break
		}
		var p railclient.Payment
		if err := json.Unmarshal(data[good:good+nl], &p); err != nil || p.RailRef == "" || p.ClientRef == "" {
			f.Close()
			return nil, nil, fmt.Errorf("state file %s: line %d is not a payment of this rail stub (move the file away to start with no payments)", path, line)
		}
		ps = append(ps, p)
		good += nl + 1
	}
	j := &journal{f: f, path: path, size: int64(good)}
	if err := j.cut(); err != nil {
		f.Close()
		return nil, nil, err
	}
	return j, ps, nil
}

// cut sets the file to its complete lines and the write offset after them.
func (j *journal) cut() error {
	if err := j.f.Truncate(j.size); err != nil {
		return fmt.Errorf("state file %s: %w", j.path, err)
	}
	if _, err := j.f.Seek(j.size, io.SeekStart); err != nil {
		return fmt.Errorf("state file %s: %w", j.path, err)
	}
	return nil
}

// append records one payment. On error nothing is recorded: a partly
// written line is cut away, so the next line starts clean.
func (j *journal) append(p railclient.Payment) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	n, err := j.f.Write(append(b, '\n'))
	if err != nil {
		if n > 0 {
			if cerr := j.cut(); cerr != nil {
				return fmt.Errorf("state file %s: %w (and cutting the partial line: %v)", j.path, err, cerr)
			}
		}
		return fmt.Errorf("state file %s: %w", j.path, err)
	}
	j.size += int64(n)
	return nil
}

func (j *journal) close() error { return j.f.Close() }
