package mount

import "testing"

// WithoutOpenat2 makes the package open paths as it does where openat2 is
// missing or filtered, until t ends.
func WithoutOpenat2(t *testing.T) {
	openat2Filtered = true
	t.Cleanup(func() { openat2Filtered = false })
}
