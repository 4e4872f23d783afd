package cuda

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/batonlm/baton/internal/model"
)

// Sampling on the device against the CPU sampler (model.Sampler), through
// model.DeviceRows as the engine drives it: greedy choices token for
// token, logprobs within 1e-4 (float32 sums on the device, float64 on the
// CPU), draws equal in distribution.

const tolSampleLogprob = 1e-4

// fixedU is a random source whose Float64 is u: the CPU sampler's draw
// with a given u (math/rand/v2 takes the low 53 bits of Uint64 over 2^53).
type fixedU struct{ u float64 }

func (f *fixedU) Uint64() uint64 { return uint64(f.u * (1 << 53)) }

// sampleCase is a request's sampling and history over one row of logits.
type sampleCase struct {
	p model.Sampling
	h model.History
}

// sampleLogits is rows of vocab random logits, drawn from few values so
// that ties are common.
func sampleLogits(rng *rand.Rand, rows, vocab int) []float32 {
	l := make([]float32, rows*vocab)
	for i := range l {
		l[i] = float32(rng.IntN(24)-16) / 4
	}
	return l
}

// randomCase is a greedy (or top-k 1) request with random bias,
// penalties, bans, allow mask and top logprobs.
func randomCase(rng *rand.Rand, vocab int) sampleCase {
	var c sampleCase
	if rng.IntN(4) == 0 {
		c.p.Temperature, c.p.TopK = 0.7, 1 // a draw in form, greedy in effect
	}
	c.p.TopLogprobs = rng.IntN(21)
	ids := func(n int) []int32 {
		s := make([]int32, n)
		for i := range s {
			s[i] = int32(rng.IntN(vocab))
		}
		return s
	}
	if rng.IntN(2) == 0 {
		c.p.LogitBias = map[int32]float64{}
		for _, id := range ids(rng.IntN(6)) {
			c.p.LogitBias[id] = float64(rng.IntN(9)-4) / 2
		}
		c.p.LogitBias[int32(vocab+3)] = 5 // outside the vocabulary: ignored
	}
	if rng.IntN(2) == 0 {
		c.p.RepetitionPenalty = 1.3
	}
	if rng.IntN(2) == 0 {
		c.p.PresencePenalty, c.p.FrequencyPenalty = 0.5, 0.25
	}
	c.h.Prompt, c.h.Generated = ids(rng.IntN(12)), ids(rng.IntN(12))
	if rng.IntN(3) == 0 {
		c.h.Ban = append(ids(rng.IntN(4)), -1, int32(vocab))
	}
	if rng.IntN(3) == 0 {
		c.h.Allow = make([]uint64, (vocab+63)/64)
		for _, id := range ids(1 + rng.IntN(40)) {
			c.h.Allow[id/64] |= 1 << (id % 64)
		}
	}
	return c
}

func sampleOnDevice(t *testing.T, b *Backend, logits []float32, vocab int, rows []int, cases []sampleCase, us []float64) []model.Sampled {
	t.Helper()
	var dr model.DeviceRows
	dr.Reset()
	for i, c := range cases {
		var rng *rand.Rand
		if us != nil {
			rng = rand.New(&fixedU{us[i]})
		}
		dr.Add(rows[i], vocab, c.p, rng, c.h)
	}
	dr.Sample(b, logits, vocab)
	out := make([]model.Sampled, len(cases))
	for i := range cases {
		s, nan := dr.Result(i)
		if nan {
			t.Fatalf("row %d: NaN flagged", i)
		}
		out[i] = s
	}
	return out
}

func checkSampled(t *testing.T, what string, got, want model.Sampled) {
	t.Helper()
	if got.ID != want.ID || math.Abs(float64(got.Logprob-want.Logprob)) > tolSampleLogprob || len(got.Top) != len(want.Top) {
		t.Fatalf("%s: got %+v, want %+v", what, got, want)
	}
	for j := range want.Top {
		if got.Top[j].ID != want.Top[j].ID || math.Abs(float64(got.Top[j].Logprob-want.Top[j].Logprob)) > tolSampleLogprob {
			t.Fatalf("%s: top %d got %+v, want %+v", what, j, got.Top, want.Top)
		}
	}
}

func testSampleGreedy(t *testing.T, b *Backend) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, vocab := range []int{37, 300, 1500} {
		const rows = 16
		logits := sampleLogits(rng, rows, vocab)
		var cases []sampleCase
		var at []int
		for i := 0; i < 3*rows; i++ {
			cases = append(cases, randomCase(rng, vocab))
			at = append(at, i%rows)
		}
		got := sampleOnDevice(t, b, logits, vocab, at, cases, nil)
		var s model.Sampler
		for i, c := range cases {
			want := s.SampleAfter(logits[at[i]*vocab:(at[i]+1)*vocab], c.p, nil, c.h)
			checkSampled(t, "greedy", got[i], want)
		}
	}
}

// sampleHist is how often each token comes out of n draws with u on a
// uniform grid ((j+0.5)/n): per token within (its candidates)/n of its
// probability, whatever order a sampler walks its candidates in.
func sampleHist(n, vocab int, draw func(us []float64) []int32) []float64 {
	us := make([]float64, n)
	for j := range us {
		us[j] = (float64(j) + 0.5) / float64(n)
	}
	h := make([]float64, vocab)
	for _, id := range draw(us) {
		h[id] += 1 / float64(n)
	}
	return h
}

// The draws' distribution: temperature, top-k, top-p, min-p and their
// combinations, with ties at the cuts, against the CPU sampler's over the
// same grid of u. A kernel that cuts one token off too many or too few
// moves that token's probability (here above 2%) between the two.
func testSampleDist(t *testing.T, b *Backend) {
	const vocab, n = 32, 3000
	rng := rand.New(rand.NewPCG(3, 4))
	logits := make([]float32, vocab)
	for i := range logits {
		logits[i] = float32(rng.IntN(12)) / 3 // ties: 12 values over 32 tokens
	}
	logits[5] = 4 // one clear top
	for _, p := range []model.Sampling{
		{Temperature: 1},
		{Temperature: 0.6},
		{Temperature: 1.5, TopK: 10},
		{Temperature: 1, TopK: 7},
		{Temperature: 1, TopP: 0.5},
		{Temperature: 0.8, TopP: 0.9},
		{Temperature: 1, MinP: 0.2},
		{Temperature: 1, TopK: 20, TopP: 0.7},
		{Temperature: 1.2, TopK: 15, TopP: 0.8, MinP: 0.05},
		{Temperature: 1, TopP: 0.6, RepetitionPenalty: 1.5, LogitBias: map[int32]float64{7: 1}},
	} {
		h := model.History{Prompt: []int32{1, 5, 9, 30}}
		cases := make([]sampleCase, n)
		rows := make([]int, n)
		for i := range cases {
			cases[i] = sampleCase{p, h}
		}
		dev := sampleHist(n, vocab, func(us []float64) []int32 {
			var ids []int32
			for _, s := range sampleOnDevice(t, b, logits, vocab, rows, cases, us) {
				ids = append(ids, s.ID)
			}
			return ids
		})
		var s model.Sampler
		cpu := sampleHist(n, vocab, func(us []float64) []int32 {
			var ids []int32
			for _, u := range us {
				ids = append(ids, s.SampleAfter(logits, p, rand.New(&fixedU{u}), h).ID)
			}
			return ids
		})
		tv := 0.0
		for i := range dev {
			tv += math.Abs(dev[i]-cpu[i]) / 2
			if min(dev[i], cpu[i]) == 0 && max(dev[i], cpu[i]) >= 5.0/n {
				t.Errorf("%+v: token %d drawn with frequency %.4f on the device, %.4f on the cpu", p, i, dev[i], cpu[i])
			}
		}
		if tv > float64(vocab)/n { // each token within 1/n on either side
			t.Errorf("%+v: total variation %.4f between device and cpu draws\ndevice %.3f\ncpu    %.3f", p, tv, dev, cpu)
		}
	}
}

// A row's choice depends on its logits, parameters and u only: the same
// in a batch of others as alone, and the same again.
func testSampleBatchInvariant(t *testing.T, b *Backend) {
	const vocab, rows = 500, 8
	rng := rand.New(rand.NewPCG(5, 6))
	logits := sampleLogits(rng, rows, vocab)
	var cases []sampleCase
	var at []int
	var us []float64
	for i := 0; i < 24; i++ {
		c := randomCase(rng, vocab)
		c.p.Temperature, c.p.TopK, c.p.TopP, c.p.MinP = 0.5+rng.Float64(), rng.IntN(40), rng.Float64(), rng.Float64()/10
		cases, at, us = append(cases, c), append(at, rng.IntN(rows)), append(us, rng.Float64())
	}
	batch := sampleOnDevice(t, b, logits, vocab, at, cases, us)
	for i := range cases {
		alone := sampleOnDevice(t, b, logits, vocab, at[i:i+1], cases[i:i+1], us[i:i+1])
		if alone[0].ID != batch[i].ID || alone[0].Logprob != batch[i].Logprob {
			t.Fatalf("case %d: alone %+v, in a batch %+v", i, alone[0], batch[i])
		}
	}
}

// A row with a NaN anywhere is flagged and nothing is chosen from it;
// the rows around it are sampled as usual.
func testSampleNaN(t *testing.T, b *Backend) {
	const vocab = 300
	rng := rand.New(rand.NewPCG(7, 8))
	logits := sampleLogits(rng, 3, vocab)
	logits[vocab+vocab-1] = float32(math.NaN())
	logits[2*vocab] = float32(math.Inf(1)) // an infinity is not a NaN
	var dr model.DeviceRows
	dr.Reset()
	for r := range 3 {
		dr.Add(r, vocab, model.Sampling{Temperature: 1, TopLogprobs: 3}, rand.New(&fixedU{0.5}), model.History{})
	}
	dr.Sample(b, logits, vocab)
	for r, want := range []bool{false, true, false} {
		if _, nan := dr.Result(r); nan != want {
			t.Fatalf("row %d: NaN %v, want %v", r, nan, want)
		}
	}
}

func runSampleSuite(t *testing.T, b *Backend) {
	t.Run("Greedy", func(t *testing.T) { testSampleGreedy(t, b) })
	t.Run("Dist", func(t *testing.T) { testSampleDist(t, b) })
	t.Run("BatchInvariant", func(t *testing.T) { testSampleBatchInvariant(t, b) })
	t.Run("NaN", func(t *testing.T) { testSampleNaN(t, b) })
}

func TestFakeSample(t *testing.T) { runSampleSuite(t, fakeBackend(t)) }

func TestGPUSample(t *testing.T) { runSampleSuite(t, gpuBackend(t)) }
