package quiesce

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
)

// Journal is the durable record of one group snapshot attempt, written
// before anything is paused and removed once the attempt's outcome is
// recorded. One found at start-up belongs to an attempt the daemon died
// in: Recover resumes its targets, and the next attempt of the same group
// undoes what the dead one made.
type Journal struct {
	Group      string            `json:"group"`
	Sources    []string          `json:"sources"`
	Parameters map[string]string `json:"parameters,omitempty"`
	Targets    []Target          `json:"targets,omitempty"`
	// Unpaused says that the attempt may have put in place a cut made
	// while its writes were no longer paused, which must be removed before
	// the name is cut again.
	Unpaused bool `json:"unpaused,omitempty"`
}

// Journals is the folder of journals, one file per group being cut.
type Journals struct {
	dir string
	log *slog.Logger
}

// OpenJournals opens (and creates) the folder dir.
func OpenJournals(dir string, log *slog.Logger) (*Journals, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("quiesce journals: %w", err)
	}
	return &Journals{dir: dir, log: log}, nil
}

// file names a group's journal by a hash: group names are any Unicode.
func (j *Journals) file(group string) string {
	sum := sha256.Sum256([]byte(group))
	return filepath.Join(j.dir, hex.EncodeToString(sum[:16])+".json")
}

// Write makes rec durable (a temporary file, synced and renamed into place,
// and the folder synced) before it returns.
func (j *Journals) Write(rec Journal) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("journal of group %q: %w", rec.Group, err)
	}
	path := j.file(rec.Group)
	tmp, err := os.CreateTemp(j.dir, ".tmp-*")
	if err != nil {
		return fmt.Errorf("journal of group %q: %w", rec.Group, err)
	}
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err == nil {
		err = j.syncDir()
	}
	if err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("journal of group %q: %w", rec.Group, err)
	}
	return nil
}

// Read returns the journal of group; ok is false when there is none.
func (j *Journals) Read(group string) (rec Journal, ok bool, err error) {
	data, err := os.ReadFile(j.file(group))
	if errors.Is(err, os.ErrNotExist) {
		return Journal{}, false, nil
	}
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	if err != nil {
		return Journal{}, false, fmt.Errorf("journal of group %q: %w", group, err)
	}
	return rec, true, nil
}

// Remove removes the journal of group durably; none is no error.
func (j *Journals) Remove(group string) error {
	if err := os.Remove(j.file(group)); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("remove journal of group %q: %w", group, err)
	}
	return j.syncDir()
}

func (j *Journals) syncDir() error {
	d, err := os.Open(j.dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// All returns every journal, and removes temporary files a crash left.
func (j *Journals) All() ([]Journal, error) {
	entries, err := os.ReadDir(j.dir)
	if err != nil {
		return nil, fmt.Errorf("quiesce journals: %w", err)
	}
	var out []Journal
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if strings.HasPrefix(name, ".tmp-") {
			os.Remove(filepath.Join(j.dir, name))
			continue
		}
		data, err := os.ReadFile(filepath.Join(j.dir, name))
		var rec Journal
		if err == nil {
			err = json.Unmarshal(data, &rec)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("journal %s: %w", name, err))
			continue
		}
		out = append(out, rec)
	}
	return out, errors.Join(errs...)
}

// Recover resumes the targets of every journal left by an attempt the
// daemon died in, and rewrites each without its targets, so that a later
// start does not resume them again; the journals stay until their attempt
// is undone. It returns how many targets were still paused.
func (j *Journals) Recover(ctx context.Context) (int, error) {
	recs, err := j.All()
	errs := []error{err}
	resumed := 0
	for _, rec := range recs {
		if len(rec.Targets) == 0 {
			continue
		}
		n, err := ResumeAll(ctx, rec.Targets)
		resumed += n
		if n > 0 {
			j.log.Warn("resumed writes paused by a group snapshot the daemon died in", "group", rec.Group, "resumed", n, "targets", len(rec.Targets))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("group %q: %w", rec.Group, err))
		} else {
			rec.Targets = nil
			if err := j.Write(rec); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return resumed, errors.Join(errs...)
}
