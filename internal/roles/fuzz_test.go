package roles

import (
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"math"
	"testing"
	"time"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// FuzzDecodeControl drives a decode worker's control plane and receiver
// gate with arbitrary sequences of Reserve, page writes, Commit, Drained,
// Abort and session-closed proofs, with keys, pages and
// counts taken from the input. Whatever the sequence: nothing panics, no
// release is refused, every page comes back once the reservations end, and
// no write landed outside a live reservation (a freed page is all NaN under
// poison, and a write would leave finite values behind).
func FuzzDecodeControl(f *testing.F) {
	f.Add([]byte{0, 5, 1, 0, 0, 0, 4, 2, 0, 5, 0, 3, 0})
	f.Add([]byte{0, 9, 0, 3, 1, 1, 0, 4, 0, 0, 6, 0, 5, 0, 1, 2})
	f.Add([]byte{0, 2, 1, 0, 1, 0, 2, 2, 0, 2, 7, 0})
	f.Fuzz(fuzzBody)
}

// newDecodeOnly is a decode worker without network: the fuzz target calls
// its handlers and its receiver gate directly.
func newDecodeOnly(t testing.TB, pageSize int) *pair {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode")}
	de, dpool, c := newWorkerEngine(t, scheduler.RoleDecode, p.dm, 64, pageSize, 64)
	p.dPool = dpool
	p.layout = Layout(ModelID("stories260K", c), c, pageSize)
	p.decode = NewDecode(DecodeOptions{DecodeDesk: DecodeDesk{Engine: de, Pool: dpool, Metrics: p.dm, MaxSeq: 512, HandoffTimeout: time.Minute, Log: log}, Layout: p.layout, ContextLength: 512})
	p.decode.SetReceiver(nil, "127.0.0.1:1", "127.0.0.1:1")
	t.Cleanup(p.decode.Close)
	return p
}

func fuzzBody(t *testing.T, in []byte) {
	want := loadRefTB(t)
	{
		if len(in) > 64 {
			in = in[:64]
		}
		p := newDecodeOnly(t, 4)
		d := p.decode
		ctx := context.Background()
		kv := p.dPool.KV()
		var keys []transfer.Key
		var pages [][]int32
		next := func() int {
			if len(in) == 0 {
				return 0
			}
			b := in[0]
			in = in[1:]
			return int(b)
		}
		pick := func() (transfer.Key, []int32) {
			i := next()
			if len(keys) == 0 || i >= 200 {
				return transfer.Key{Room: uint64(i), Epoch: uint64(next()), Cap: transfer.Capability{byte(next())}}, nil
			}
			return keys[i%len(keys)], pages[i%len(keys)]
		}
		for len(in) > 0 {
			switch next() % 9 {
			case 0: // Reserve a prompt of 1..16 tokens from the reference
				n := 1 + next()%min(16, len(want.PromptIDs)*3)
				prompt := make([]int32, n)
				for i := range prompt {
					prompt[i] = want.PromptIDs[i%len(want.PromptIDs)]
				}
				res, err := d.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "f", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 2},
					Layout: p.layout, Writer: "w"})
				if err == nil {
					keys = append(keys, resKey(res))
					pages = append(pages, res.Pages)
				}
			case 1: // a page frame: index, page id and token count from the input
				k, pg := pick()
				idx, tokens := next()%8, 1+next()%4
				page := int32(next() % p.dPool.NumPages())
				if pg != nil && next()%2 == 0 && idx < len(pg) {
					page = pg[idx]
				}
				data := make([]byte, transfer.PackedSize(kv, tokens))
				for i := 0; i+4 <= len(data); i += 4 {
					binary.LittleEndian.PutUint32(data[i:], math.Float32bits(1))
				}
				_ = d.Write(k, transfer.PageWrite{Index: idx, Page: page, Tokens: tokens, Data: data})
			case 2: // Commit with claimed tokens and checksums from the input
				k, pg := pick()
				sums := make([]uint64, len(pg))
				for i := range sums {
					sums[i] = uint64(next())
				}
				_, _ = d.Commit(ctx, &pdv1.CommitRequest{Room: k.Room, Epoch: k.Epoch, TokensWritten: uint32(next() % 20),
					PageChecksums: sums, FirstToken: &pdv1.Token{Id: int32(next())}, Writer: "w", Capability: k.Cap[:], SessionId: k.Session[:]})
			case 3:
				k, _ := pick()
				_, _ = d.Drained(ctx, &pdv1.DrainedRequest{Room: k.Room, Epoch: k.Epoch, Writer: "w", Capability: k.Cap[:]})
			case 4:
				k, _ := pick()
				_, _ = d.Abort(ctx, &pdv1.AbortRequest{Room: k.Room, Epoch: k.Epoch, Reason: "fuzz", Capability: k.Cap[:]})
			case 5:
				k, _ := pick()
				_, _ = d.Abort(ctx, &pdv1.AbortRequest{Room: k.Room, Epoch: k.Epoch, Reason: "fuzz", Capability: k.Cap[:]})
			case 6:
				k, _ := pick()
				d.Closed(k, "fuzz: session closed")
			case 7:
				k, _ := pick()
				_, _ = d.Finish(ctx, &pdv1.AbortRequest{Room: k.Room, Epoch: k.Epoch, Capability: k.Cap[:]})
			case 8: // a transfer session opens (the zero session, as every frame here names)
				k, _ := pick()
				_, _ = d.Admit(k)
			}
		}
		// End everything: abort what is live, then prove every writer gone.
		for _, k := range keys {
			_, _ = d.Abort(ctx, &pdv1.AbortRequest{Room: k.Room, Epoch: k.Epoch, Reason: "end", Capability: k.Cap[:]})
			d.Closed(k, "end: session closed")
		}
		deadline := time.Now().Add(10 * time.Second)
		for p.dPool.Free() != p.dPool.NumPages() && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		st := p.dPool.Stats()
		if st.Free != st.Total || st.ReleaseErrors != 0 {
			t.Fatalf("after the sequence: %+v", st)
		}
		for i, v := range kv.Data {
			if !math.IsNaN(float64(v)) {
				t.Fatalf("a freed page holds a written value at float %d (page %d): a write landed outside a live reservation", i, i/kv.PageFloats())
			}
		}
	}
}
