package grammar

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkMask measures FillMask along sampled completions of the
// realistic schema, after one pass has filled the context cache (as it
// is after the first few requests with a schema). Besides ns/op it
// reports the median and 99th percentile of single steps.
func BenchmarkMask(b *testing.B) {
	g, err := FromJSONSchema(realisticSchema)
	if err != nil {
		b.Fatal(err)
	}
	for _, vn := range []string{"llama-spm", "gpt-2", "qwen3"} {
		b.Run(vn, func(b *testing.B) {
			tok := loadTok(b, vn)
			c := mustCompile(b, g, tok)
			rng := rand.New(rand.NewPCG(1, 1))
			var paths [][]int32
			for n := 0; n < 2000; {
				ids, ok := sample(b, c, rng, 3000)
				if ok {
					paths = append(paths, ids)
					n += len(ids)
				}
			}
			mask := make([]uint64, c.MaskWords())
			steps := 0
			for _, p := range paths {
				m := c.NewMatcher()
				for _, id := range p {
					m.FillMask(mask)
					if err := m.Accept(id); err != nil {
						b.Fatal(err)
					}
					steps++
				}
			}
			times := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			pi, ti := 0, 0
			m := c.NewMatcher()
			for range b.N {
				if ti == len(paths[pi]) {
					pi, ti = (pi+1)%len(paths), 0
					m = c.NewMatcher()
				}
				t0 := time.Now()
				m.FillMask(mask)
				times = append(times, time.Since(t0))
				b.StopTimer()
				if err := m.Accept(paths[pi][ti]); err != nil {
					b.Fatal(err)
				}
				ti++
				b.StartTimer()
			}
			b.StopTimer()
			slices.Sort(times)
			b.ReportMetric(float64(times[len(times)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(times[len(times)*99/100].Nanoseconds()), "p99-ns")
			b.ReportMetric(float64(len(c.ctxs)), "contexts")
			b.ReportMetric(float64(c.cacheBytes())/1024, "cache-KiB")
			b.ReportMetric(float64(c.VocabSize()), "vocab")
		})
	}
}

// BenchmarkAccept measures Accept alone along the same kind of paths.
func BenchmarkAccept(b *testing.B) {
	g, err := FromJSONSchema(realisticSchema)
	if err != nil {
		b.Fatal(err)
	}
	c := mustCompile(b, g, loadTok(b, "llama-spm"))
	rng := rand.New(rand.NewPCG(1, 1))
	var path []int32
	for path == nil {
		if ids, ok := sample(b, c, rng, 3000); ok {
			path = ids
		}
	}
	b.ResetTimer()
	m := c.NewMatcher()
	ti := 0
	for range b.N {
		if ti == len(path) {
			m, ti = c.NewMatcher(), 0
		}
		if err := m.Accept(path[ti]); err != nil {
			b.Fatal(err)
		}
		ti++
	}
}

// BenchmarkCompileCold measures a schema's cost before any request: build,
// bind to the vocabulary and one complete generation that meets each
// context for the first time.
func BenchmarkCompileCold(b *testing.B) {
	for _, vn := range []string{"llama-spm", "qwen3"} {
		b.Run(vn, func(b *testing.B) {
			tok := loadTok(b, vn)
			vocabOf(tok)
			mask := make([]uint64, (tok.VocabSize()+63)/64)
			var path []int32
			{
				g, _ := FromJSONSchema(realisticSchema)
				c := mustCompile(b, g, tok)
				rng := rand.New(rand.NewPCG(1, 1))
				for path == nil {
					if ids, ok := sample(b, c, rng, 3000); ok {
						path = ids
					}
				}
			}
			b.ResetTimer()
			for range b.N {
				g, err := FromJSONSchema(realisticSchema)
				if err != nil {
					b.Fatal(err)
				}
				c := mustCompile(b, g, tok)
				m := c.NewMatcher()
				for _, id := range path {
					m.FillMask(mask)
					_ = m.Accept(id)
				}
			}
		})
	}
}
