package pdv1

import (
	"crypto/sha256"
	"encoding/hex"
	"slices"
)

// TokenizerSum is TokenizerFiles.sha256: the files, names sorted, each as
// name NUL content NUL.
func TokenizerSum(files map[string][]byte) string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	h := sha256.New()
	for _, n := range names {
		h.Write([]byte(n))
		h.Write([]byte{0})
		h.Write(files[n])
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}
