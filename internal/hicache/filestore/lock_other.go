//go:build !unix

package filestore

import (
	"fmt"
	"os"
)

// lockFile only creates the lock file where flock is not available: one
// Store per directory and Meta is then the operator's to ensure.
func lockFile(root *os.Root, name string) (*os.File, error) {
	f, err := root.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("filestore: %w", err)
	}
	return f, nil
}
