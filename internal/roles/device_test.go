package roles

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kernels/kernelstest"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
)

func deviceMemory(t *testing.T, pool *kvpool.Pool) *kernelstest.Memory {
	t.Helper()
	m, ok := pool.KV().Device.(*kernelstest.Memory)
	if !ok {
		t.Fatalf("pool memory is %T, not a backend's", pool.KV().Device)
	}
	return m
}

// With both pools in a backend's own memory (as on GPUs), the handoff goes
// a page at a time through the pools' page operations: prefill reads each
// page it ships, decode writes each received page and reads it back to
// check what landed, and freed pages are poisoned there.
func TestHandoffDevicePool(t *testing.T) {
	want := loadRef(t)
	for _, tc := range []struct{ page, chunk int }{{16, 512}, {1, 2}, {64, 3}} {
		p := newPairOn(t, kernelstest.Device{Backend: cpu.New(1)}, tc.page, tc.chunk)
		handoffsMatch(t, p, want, 4, fmt.Sprintf("page %d chunk %d", tc.page, tc.chunk))
		pages := int64(4 * p.pPool.PagesFor(len(want.PromptIDs)))
		pm, dm := deviceMemory(t, p.pPool), deviceMemory(t, p.dPool)
		if r := pm.Reads.Load(); r != pages {
			t.Errorf("page %d: prefill read %d pages from its pool, want %d", tc.page, r, pages)
		}
		if w, r := dm.Writes.Load(), dm.Reads.Load(); w != pages || r != pages {
			t.Errorf("page %d: decode wrote %d and read back %d pages, want %d each", tc.page, w, r, pages)
		}
		for i, f := range dm.Snapshot() {
			if !math.IsNaN(float64(f)) {
				t.Fatalf("page %d: freed decode pool holds %g at %d, want the poison", tc.page, f, i)
			}
		}
	}
}

// Decode checks the checksum of what is in its device pool, not of the
// frames it received: a page that differs there fails the commit.
func TestDevicePoolChecksumReadsBack(t *testing.T) {
	want := loadRef(t)
	p := newPairOn(t, kernelstest.Device{Backend: cpu.New(1)}, 4, 512)
	ctx := context.Background()
	prompt := want.PromptIDs[:8]
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "x", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	kv := p.dPool.KV()
	sums := writeFullPages(t, sess, kv, res.Pages, transfer.Checksum)
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The second page changes in device memory after it landed.
	if err := kv.Device.WritePage(res.Pages[1], 4, make([]byte, transfer.PackedSize(kv, 4))); err != nil {
		t.Fatal(err)
	}
	_, err = p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(prompt)),
		PageChecksums: sums, FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: res.Capability, SessionId: sidOf(sess)})
	if err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("commit over a page that changed on the device: %v", err)
	}
	sess.Close()
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}

// A prefill worker whose pool cannot be read fails the request instead of
// shipping or committing anything, and once the router aborts the
// reservation every page on both sides comes back.
func TestPrefillDeviceReadFails(t *testing.T) {
	want := loadRef(t)
	p := newPairOn(t, kernelstest.Device{Backend: cpu.New(1)}, 16, 512)
	deviceMemory(t, p.pPool).FailReads.Store(true)
	ctx := context.Background()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "r", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 8},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	_, err = p.pc.Prefill(ctx, &pdv1.PrefillRequest{RequestId: "r", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 8}, Reservation: res})
	if err == nil || !strings.Contains(err.Error(), "device read failed") {
		t.Fatalf("prefill from an unreadable pool: %v", err)
	}
	if w := deviceMemory(t, p.dPool).Writes.Load(); w != 0 {
		t.Fatalf("%d pages reached the decode pool", w)
	}
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "prefill failed", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool, p.pPool)
}

// writeFullPages writes every page of a reservation, full, with 0.5-ish
// floats distinct per page, and returns each page's sum.
func writeFullPages(t *testing.T, sess transfer.Session, kv kernels.PagedKV, pages []int32, sum func([]byte) uint64) []uint64 {
	t.Helper()
	var sums []uint64
	for i, pg := range pages {
		data := make([]byte, transfer.PackedSize(kv, kv.PageSize))
		for j := 0; j < len(data); j += 4 {
			data[j+3] = 0x3f
			data[j] = byte(i + 1)
		}
		sums = append(sums, sum(data))
		if err := sess.Write(transfer.PageWrite{Index: i, Page: pg, Tokens: kv.PageSize, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	return sums
}
