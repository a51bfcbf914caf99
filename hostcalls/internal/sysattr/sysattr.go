// Package sysattr reads and writes kernel attribute files (sysfs,
// configfs), which want a value read whole and written in one write.
package sysattr

import (
	"os"
	"strings"
)

// Read returns the attribute at path without surrounding white space.
func Read(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Write writes v to an existing attribute in one write, with no trailing
// newline; it never creates files.
func Write(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if _, err := f.Write([]byte(v)); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
