package cuda

import (
	"strings"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// TestFakeAllocKVTooLarge: a pool the device cannot hold is an error that
// says what and how much, and nothing is left allocated.
func TestFakeAllocKVTooLarge(t *testing.T) {
	b := fakeBackend(t)
	_, err := b.AllocKV(kernels.PagedKV{PageSize: 16, Layers: 32, KVHeads: 8, HeadDim: 128}, 1<<26)
	if err == nil || !strings.Contains(err.Error(), "for the KV pool") {
		t.Fatalf("a 32 TiB pool: %v", err)
	}
	if len(b.pools) != 0 {
		t.Fatalf("%d pools tracked after a failed AllocKV", len(b.pools))
	}
}
