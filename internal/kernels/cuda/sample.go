package cuda

import (
	"fmt"
	"unsafe"

	"github.com/batonlm/baton/internal/kernels"
)

// Sampling on the device (kernels.RowSampler; kernels/sample.cuh): the
// logits of a step stay where the LM head wrote them, and a call copies
// in each row's parameters and edits and copies out its choice (176 bytes
// a row), instead of the whole rows (600 KB each at a 152K vocabulary).

const (
	sampleThreads = 512 // BK_SAMPLE_THREADS
	sampleMaxTop  = 20  // BK_SAMPLE_MAX_TOP
)

var _ kernels.RowSampler = (*Backend)(nil)

// sampleDesc mirrors bk_sample_desc.
type sampleDesc struct {
	row, work, edits, nedits, bans, nbans, allow, nallow, draw, topk, ntop int64
	temp, topp, minp, u, rep                                               float64
}

// sampleEdit mirrors bk_logit_edit.
type sampleEdit struct {
	id        int32
	bias, pen float32
	rep       int32
}

// sampleOut mirrors bk_sample_out.
type sampleOut struct {
	id    int32
	lp    float32
	nan   int32
	ntop  int32
	topID [sampleMaxTop]int32
	topLP [sampleMaxTop]float32
}

// samplePlan is a SampleRows call's host tables, reused between calls.
type samplePlan struct {
	descs []sampleDesc
	edits []sampleEdit
	bans  []int32
	allow []uint64
	out   []sampleOut
}

// SampleRows implements kernels.RowSampler: one block a row.
func (b *Backend) SampleRows(logits []float32, vocab int, rows []kernels.SampleRow, out []kernels.SampleResult) {
	if len(rows) == 0 {
		return
	}
	if vocab <= 0 || len(out) != len(rows) {
		panic(fmt.Sprintf("cuda: SampleRows of %d rows into %d results, vocab %d", len(rows), len(out), vocab))
	}
	nrows := len(logits) / vocab
	p := &b.sample
	p.descs, p.edits, p.bans, p.allow = p.descs[:0], p.edits[:0], p.bans[:0], p.allow[:0]
	work := int64(0)
	for _, r := range rows {
		if r.Row < 0 || r.Row >= nrows {
			panic(fmt.Sprintf("cuda: SampleRows row %d of %d", r.Row, nrows))
		}
		if r.TopLogprobs > kernels.MaxTopLogprobs {
			panic(fmt.Sprintf("cuda: SampleRows with %d top logprobs (at most %d)", r.TopLogprobs, kernels.MaxTopLogprobs))
		}
		d := sampleDesc{row: int64(r.Row), work: -1, edits: int64(len(p.edits)), bans: int64(len(p.bans)),
			allow: int64(len(p.allow)), nallow: -1, topk: int64(r.TopK), ntop: int64(min(r.TopLogprobs, vocab)),
			temp: r.Temperature, topp: r.TopP, minp: r.MinP, u: r.U, rep: float64(r.Repetition)}
		for _, e := range r.Edits {
			if e.ID < 0 || int(e.ID) >= vocab {
				panic(fmt.Sprintf("cuda: SampleRows edit of token %d (vocab %d)", e.ID, vocab))
			}
			se := sampleEdit{id: e.ID, bias: e.Bias, pen: e.Penalty}
			if e.Repeat {
				se.rep = 1
			}
			p.edits = append(p.edits, se)
		}
		for _, id := range r.Ban {
			if id >= 0 && int(id) < vocab {
				p.bans = append(p.bans, id)
			}
		}
		if r.Allow != nil {
			p.allow = append(p.allow, r.Allow...)
			d.nallow = int64(len(r.Allow))
		}
		d.nedits, d.nbans = int64(len(p.edits))-d.edits, int64(len(p.bans))-d.bans
		if r.Draw {
			d.draw = 1
		}
		if d.nedits > 0 || d.nbans > 0 || d.nallow >= 0 || r.Draw {
			d.work = work // the adjusted row, then a draw's probabilities
			work++
		}
		p.descs = append(p.descs, d)
	}
	if cap(p.out) < len(rows) {
		p.out = make([]sampleOut, len(rows))
	}
	p.out = p.out[:len(rows)]

	b.lock()
	defer b.unlock()
	dl := b.in(sX, logits[:nrows*vocab])
	dd := upload(b, sSample, p.descs)
	de := upload(b, sSampleE, p.edits)
	db := upload(b, sSampleB, p.bans)
	da := upload(b, sSampleA, p.allow)
	dw := b.buf(sSampleW, 4*int(max(work, 1))*vocab)
	do := b.buf(sSampleO, len(p.out)*int(unsafe.Sizeof(sampleOut{})))
	b.launch(kSample, len(rows), 1, min(sampleThreads, roundUp(vocab, 32)), 0, do, dl, dw, dd, de, db, da,
		argI(len(rows)), argI(vocab))
	b.d2h(unsafe.Pointer(unsafe.SliceData(p.out)), do, len(p.out)*int(unsafe.Sizeof(sampleOut{})))
	for i, o := range p.out {
		res := kernels.SampleResult{ID: o.id, Logprob: o.lp, NaN: o.nan != 0}
		for j := 0; j < int(o.ntop) && !res.NaN; j++ {
			res.Top = append(res.Top, kernels.TokenLogprob{ID: o.topID[j], Logprob: o.topLP[j]})
		}
		out[i] = res
	}
}
