package cuda

import (
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/kernels"
)

// TestFakeSumPages: bk_page_sum over pages where they are equals
// kernels.PageSum of the same pages packed on the host, for every KV
// dtype, full, partial, one-token and empty pages, the same page twice in
// one call, and pages the pool was just written through; a page outside
// the pool or too many tokens is refused.
func TestFakeSumPages(t *testing.T) { checkSumPages(t, fakeBackend(t)) }

// TestGPUSumPages is the same on the GPU, where blocks of a page add
// their parts by atomics in any order.
func TestGPUSumPages(t *testing.T) { checkSumPages(t, gpuBackend(t)) }

func checkSumPages(t *testing.T, b *Backend) {
	for i, dt := range ipcDTypes {
		src, host := ipcSource(t, b, dt, uint64(90+i))
		ps := host.PageSize
		pages := []int32{0, 1, 2, 3, 1, 2}
		tokens := []int{ps, ps - 1, 1, 0, ps, ps / 2}
		got, err := src.SumPages(pages, tokens)
		if err != nil {
			t.Fatal(err)
		}
		for j, p := range pages {
			if want := kernels.PageSum(kernels.PackPage(host, p, tokens[j], nil)); got[j] != want {
				t.Fatalf("%s: page %d, %d tokens: device sum %#x, PageSum %#x", dt, p, tokens[j], got[j], want)
			}
		}
		// A write through the pool changes the page's sum to the new rows'.
		rng := rand.New(rand.NewPCG(uint64(i), 7))
		row := kernels.PackPage(host, 3, ps, nil)
		for k := range row {
			row[k] = byte(rng.Uint32())
		}
		if dt != kernels.F32 { // keep the halves finite: any bits do for a sum
			for k := 1; k < len(row); k += 2 {
				row[k] &= 0x3f
			}
		}
		if err := src.WritePage(3, ps, row); err != nil {
			t.Fatal(err)
		}
		got, err = src.SumPages([]int32{3}, []int{ps})
		if err != nil {
			t.Fatal(err)
		}
		if want := kernels.PageSum(row); got[0] != want {
			t.Fatalf("%s: after a write: device sum %#x, PageSum %#x", dt, got[0], want)
		}
		if _, err := src.SumPages([]int32{int32(src.Pages())}, []int{1}); err == nil {
			t.Fatalf("%s: a page outside the pool was summed", dt)
		}
		if _, err := src.SumPages([]int32{0}, []int{ps + 1}); err == nil {
			t.Fatalf("%s: %d tokens of a %d-token page were summed", dt, ps+1, ps)
		}
	}
}
