package roles

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/kernels/cpu"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
)

// Checks of decode's handoff held by unit tests rather than only by the
// gates' real processes: each test below fails when its check is taken out
// of the release code (see test/gates/README.md, "Tests that stand for a
// rule").

// longPrompt is a prompt of n tokens (the reference prompt, continued by
// its reference text), for reservations of several full pages.
func longPrompt(want reference, n int) []int32 {
	return slices.Concat(want.PromptIDs, want.GeneratedIDs)[:n]
}

// openSession opens a writer's transfer session into res (the one decode
// binds the reservation to).
func openSession(t *testing.T, ctx context.Context, res *pdv1.Reservation) transfer.Session {
	t.Helper()
	sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sess.Close() })
	return sess
}

// pageContents is what page holds in its first tokens slots, packed.
func pageContents(t *testing.T, pool *kvpool.Pool, page int32, tokens int) []byte {
	t.Helper()
	b, err := transfer.ReadPage(pool.KV(), page, tokens, nil)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ones is a page payload of tokens slots, every value 1.0: bytes no pool
// page holds unless a frame put them there.
func ones(pool *kvpool.Pool, tokens int) []byte {
	b := make([]byte, transfer.PackedSize(pool.KV(), tokens))
	for i := 0; i+4 <= len(b); i += 4 {
		copy(b[i:], []byte{0, 0, 0x80, 0x3f}) // float32 1.0, little endian
	}
	return b
}

// Drained frees an aborted reservation's quarantined pages only when it
// comes from the reservation's writer (DESIGN.md, "Pages": a page is free
// only when the request is terminal and the writer that was given its
// address confirmed it has no write in flight). A Drained naming another
// writer, even with the capability, is dropped and counted, and the pages
// stay quarantined while the real writer may still be writing.
func TestDrainedOnlyFromTheWriter(t *testing.T) {
	want := loadRef(t)
	// No eviction of the held-open session while the test looks: only a
	// Drained can free the pages here.
	p := newPair(t, 4, 512, func(o *DecodeOptions) { o.HandoffTimeout = time.Minute })
	ctx := context.Background()
	const writer = "127.0.0.1:1" // not a real prefill: Abort to it fails
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "drained", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: p.layout, Writer: writer})
	if err != nil {
		t.Fatal(err)
	}
	sess := openSession(t, ctx, res)
	if err := sess.Write(transfer.PageWrite{Index: 0, Page: res.Pages[0], Tokens: 4, Data: make([]byte, transfer.PackedSize(p.dPool.KV(), 4))}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "client left", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	r := p.decode.find("test", res.Room, res.Epoch, res.Capability)
	if r == nil {
		t.Fatal("reservation not found")
	}
	if st := p.dPool.Stats(); st.Quarantined != len(res.Pages) || r.r.State() != scheduler.StateDraining {
		t.Fatalf("after the abort: %s, %d quarantined, want Draining and the %d prompt pages; %+v", r.r.State(), st.Quarantined, len(res.Pages), st)
	}
	for i, other := range []string{"127.0.0.1:2", ""} {
		if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: other, Capability: res.Capability}); err != nil {
			t.Fatal(err)
		}
		if st := p.dPool.Stats(); st.Quarantined != len(res.Pages) || r.r.State() != scheduler.StateDraining {
			t.Fatalf("a Drained from %q (the writer is %q) ended the quarantine: %s, %d quarantined, want %d; %+v",
				other, writer, r.r.State(), st.Quarantined, len(res.Pages), st)
		}
		if n := labelled(t, p.dm, "baton_late_messages_dropped_total", "kind", "drained"); n != float64(i+1) {
			t.Fatalf("after %d Drained from another writer, %v dropped", i+1, n)
		}
	}
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: writer, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}

// A Commit is the word of the writer the reservation was made for (Reserve's
// Writer): one naming another writer is refused by Commit's writer check
// and counted under "writer", even from the bound session with every page
// written in full and every checksum right; the request never decodes. The
// same Commit from the reservation's writer is accepted.
func TestCommitOnlyFromTheReservationsWriter(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	reserve := func() *pdv1.Reservation {
		res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "writer", Prompt: want.PromptIDs, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
			Layout: p.layout, Writer: p.prefillAddr})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	commit := func(res *pdv1.Reservation, sess transfer.Session, sums []uint64, writer string) error {
		_, err := p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: res.PromptTokens, PageChecksums: sums,
			FirstToken: &pdv1.Token{Id: 5}, Writer: writer, Capability: res.Capability, SessionId: sidOf(sess)})
		return err
	}

	// The control: the writer's own Commit passes every check.
	res := reserve()
	sess, sums := landZeros(t, ctx, p, res)
	if err := commit(res, sess, sums, p.prefillAddr); err != nil {
		t.Fatalf("the reservation's writer's Commit was refused: %v", err)
	}
	_ = sess.Close()
	waitAllFree(t, p.dPool)

	res = reserve()
	sess, sums = landZeros(t, ctx, p, res)
	const other = "127.0.0.1:2"
	err := commit(res, sess, sums, other)
	if err == nil {
		t.Fatalf("a Commit from writer %q was accepted for a reservation made for writer %q", other, p.prefillAddr)
	}
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("a Commit from another writer: %v, want FailedPrecondition", err)
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "writer"); n != 1 {
		t.Fatalf("the Commit from another writer counted %v times under reason=writer, want 1 (%v)", n, err)
	}
	r := p.decode.find("test", res.Room, res.Epoch, res.Capability)
	if r == nil {
		t.Fatal("reservation not found")
	}
	if st := r.r.State(); st == scheduler.StateCommitted || st == scheduler.StateDecoding || st == scheduler.StateFinished {
		t.Fatalf("the request whose Commit came from another writer is %s", st)
	}
	_ = sess.Close()
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}

// Commit's coverage check holds per page: a Commit whose token count
// claims the whole prompt, with a checksum for every page that matches
// what the page holds, is still refused when a page was never covered by
// a frame (its written count is short). The page skipped here is in the
// middle of the prompt and still holds the pool's poison.
func TestCommitCoversEveryPage(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prompt := longPrompt(want, 12) // three full pages
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "cover", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 4},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Pages) != 3 {
		t.Fatalf("reserved %d prompt pages, want 3", len(res.Pages))
	}
	const skipped = 1
	sess := openSession(t, ctx, res)
	sums := make([]uint64, len(res.Pages))
	for i, pg := range res.Pages {
		if i == skipped {
			// No frame; the claim is the checksum of what the page holds,
			// so only coverage can tell.
			sums[i] = transfer.Checksum(pageContents(t, p.dPool, pg, 4))
			continue
		}
		data := make([]byte, transfer.PackedSize(p.dPool.KV(), 4))
		if err := sess.Write(transfer.PageWrite{Index: i, Page: pg, Tokens: 4, Data: data}); err != nil {
			t.Fatal(err)
		}
		sums[i] = transfer.Checksum(data)
	}
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = p.dc.Commit(ctx, &pdv1.CommitRequest{Room: res.Room, Epoch: res.Epoch, TokensWritten: uint32(len(prompt)), PageChecksums: sums,
		FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: res.Capability, SessionId: sidOf(sess)})
	if err == nil {
		t.Fatalf("a Commit claiming all %d tokens was accepted with page %d (index %d) never written", len(prompt), res.Pages[skipped], skipped)
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "coverage"); n != 1 {
		t.Fatalf("the uncovered page counted %v times under reason=coverage, want 1 (%v)", n, err)
	}
	_ = sess.Close()
	if _, err := p.dc.Drained(ctx, &pdv1.DrainedRequest{Room: res.Room, Epoch: res.Epoch, Writer: p.prefillAddr, Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}

// A frame lands only in the page the reservation gave its index: decode's
// receiver refuses a frame for index i that names another page, whether
// another page of the same reservation or a page of the same request past
// its prompt (both tagged with the request's own owner, so the owner tag
// alone would let them in), and the page named is left as it was.
func TestFrameLandsOnlyAtItsIndexPage(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prompt := longPrompt(want, 12) // three full pages
	for _, tc := range []struct {
		what string
		// aim picks the page the frame for index 0 names, of the
		// request's pages (prompt pages first) and its prompt pages.
		aim func(all, prompt []int32) int32
	}{
		{"the reservation's page at index 1", func(_, prompt []int32) int32 { return prompt[1] }},
		{"the request's first completion page", func(all, prompt []int32) int32 { return all[len(prompt)] }},
	} {
		t.Run(tc.what, func(t *testing.T) { frameAtAnotherIndex(t, ctx, p, prompt, tc.what, tc.aim) })
	}
}

// frameAtAnotherIndex reserves prompt, sends one frame for index 0 naming
// the page aim picks (what names it), and requires the frame refused and
// the page untouched.
func frameAtAnotherIndex(t *testing.T, ctx context.Context, p *pair, prompt []int32, what string, aim func(all, prompt []int32) int32) {
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "index", Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 8},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	r := p.decode.find("test", res.Room, res.Epoch, res.Capability)
	if r == nil {
		t.Fatal("reservation not found")
	}
	all := r.r.Pages()
	if len(res.Pages) != 3 || len(all) <= len(res.Pages) {
		t.Fatalf("the request holds %d pages, %d for its prompt; want 3 and more", len(all), len(res.Pages))
	}
	page := aim(all, res.Pages)
	owner, written, st := p.dPool.Owner(page)
	if owner != r.r.Owner() || st != kvpool.PageAllocated {
		t.Fatalf("%s (page %d) is tagged %v (%s), not the request's %v", what, page, owner, st, r.r.Owner())
	}
	before := pageContents(t, p.dPool, page, 4)
	sess := openSession(t, ctx, res)
	if err := sess.Write(transfer.PageWrite{Index: 0, Page: page, Tokens: 4, Data: ones(p.dPool, 4)}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Flush(ctx); err == nil {
		t.Fatalf("a frame for index 0 (page %d) that names %s (page %d) was accepted", res.Pages[0], what, page)
	}
	if got := pageContents(t, p.dPool, page, 4); !bytes.Equal(got, before) {
		t.Fatalf("a frame for index 0 changed %s (page %d)", what, page)
	}
	if _, w, _ := p.dPool.Owner(page); w != written {
		t.Fatalf("a frame for index 0 marked %s (page %d) written: %d tokens, %d before", what, page, w, written)
	}
	_ = sess.Close()
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "test over", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
	waitAllFree(t, p.dPool)
}

// newCachedDecode is a decode worker whose engine keeps finished requests'
// pages in a prefix cache (--disaggregation-decode-enable-radix-cache), with
// a tcp receiver and a gRPC server; no prefill worker. Writers are played
// by the test.
func newCachedDecode(t *testing.T, pageSize int) (*pair, *prefixcache.Cache) {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	p := &pair{dm: metrics.New("decode"), prefillAddr: "127.0.0.1:1"}
	l, err := model.Load(model.LoadOptions{}, cpu.New(1))
	if err != nil {
		t.Fatal(err)
	}
	c := l.Model.Config
	pool, err := kvpool.New(kvpool.Config{NumPages: 4096 / pageSize, PageSize: pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, Poison: true})
	if err != nil {
		t.Fatal(err)
	}
	cache := prefixcache.New(pool, "stories260K", prefixcache.Guards{})
	cache.SetChecksum(func(page int32) ([]byte, uint64, error) {
		b, err := transfer.ReadPage(pool.KV(), page, pageSize, nil)
		return b, transfer.Checksum(b), err
	})
	e := scheduler.NewEngine(l.Model, pool, scheduler.Config{Role: scheduler.RoleDecode, ContextLength: c.ContextLength, ChunkSize: 512,
		MaxRunning: testMaxRunning, IsEOG: func(id int32) bool { return id == 2 }, PrefixCache: cache}, p.dm)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	p.dPool = pool
	p.layout = Layout(ModelID("stories260K", &c), &c, pageSize)
	p.decode = NewDecode(DecodeOptions{DecodeDesk: DecodeDesk{Engine: e, Pool: pool, Metrics: p.dm, MaxSeq: 512, HandoffTimeout: time.Minute, Cache: cache, Log: log}, Layout: p.layout, ContextLength: 512})
	t.Cleanup(p.decode.Close)
	recv, err := tcp.Listen("127.0.0.1:0", p.decode)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { recv.Close() })
	daddr := serveGRPC(t, func(gs *grpc.Server) { pdv1.RegisterDecodeServer(gs, p.decode) })
	p.decode.SetReceiver(recv, daddr, recv.Addr())
	p.dc = pdv1.NewDecodeClient(dial(t, daddr))
	return p, cache
}

// A frame lands only in a page tagged with the reservation's own owner
// (room, epoch) and still allocated to it: decode's receiver refuses a
// frame aimed at a page of another live reservation, and one aimed at a
// page the reservation holds from decode's prefix cache (shared, tagged
// with the cache's owner, read by other requests): the pages keep their
// bytes, and the cached page is still cached under the checksum it had.
func TestFrameOwnerTagChecked(t *testing.T) {
	want := loadRef(t)
	p, cache := newCachedDecode(t, 4)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	prompt := longPrompt(want, 13) // three full pages and one token
	reserve := func(id string) (*pdv1.Reservation, *found) {
		res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: id, Prompt: prompt, Sampling: &pdv1.SamplingParams{MaxTokens: 2},
			Layout: p.layout, Writer: p.prefillAddr})
		if err != nil {
			t.Fatal(err)
		}
		r := p.decode.find("test", res.Room, res.Epoch, res.Capability)
		if r == nil {
			t.Fatal("reservation not found")
		}
		return res, r
	}
	// refused sends one frame for index 0 of res aiming at page, in a
	// session of its own, and requires the receiver to refuse it and the
	// page to keep its bytes and written count.
	refused := func(what string, res *pdv1.Reservation, page int32) {
		t.Helper()
		before := pageContents(t, p.dPool, page, 4)
		_, written, _ := p.dPool.Owner(page)
		sess := openSession(t, ctx, res)
		if err := sess.Write(transfer.PageWrite{Index: 0, Page: page, Tokens: 4, Data: ones(p.dPool, 4)}); err != nil {
			t.Fatal(err)
		}
		if err := sess.Flush(ctx); err == nil {
			t.Fatalf("a frame into %s (page %d) was accepted", what, page)
		}
		if got := pageContents(t, p.dPool, page, 4); !bytes.Equal(got, before) {
			t.Fatalf("a frame aimed at %s (page %d) changed its bytes", what, page)
		}
		if _, w, _ := p.dPool.Owner(page); w != written {
			t.Fatalf("a frame aimed at %s (page %d) marked it written: %d tokens, %d before", what, page, w, written)
		}
		_ = sess.Close()
	}
	abort := func(res *pdv1.Reservation) {
		if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "test over", Capability: res.Capability}); err != nil {
			t.Fatal(err)
		}
	}

	// Another live reservation's page.
	victim, _ := reserve("victim")
	attacker, _ := reserve("attacker")
	refused("another reservation's page", attacker, victim.Pages[0])
	abort(attacker)
	abort(victim)
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "owner_tag"); n != 1 {
		t.Fatalf("the frame into another reservation's page counted %v times under reason=owner_tag, want 1", n)
	}

	// Fill decode's cache: a handoff whose request finishes publishes its
	// full prompt pages.
	first, _ := reserve("first")
	sess, sums := landZeros(t, ctx, p, first)
	if _, err := p.dc.Commit(ctx, &pdv1.CommitRequest{Room: first.Room, Epoch: first.Epoch, TokensWritten: first.PromptTokens, PageChecksums: sums,
		FirstToken: &pdv1.Token{Id: 5}, Writer: p.prefillAddr, Capability: first.Capability, SessionId: sidOf(sess)}); err != nil {
		t.Fatal(err)
	}
	_ = sess.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if st := p.dPool.Stats(); st.Allocated == 0 && st.Cached >= 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the finished request's pages never reached the cache: %+v", p.dPool.Stats())
		}
	}

	// A reservation of the same prompt holds them: they are in its page
	// table (and in Reserve's reply), shared, not the request's to write.
	res, r := reserve("held")
	held := r.r.Held()
	if len(held) == 0 || res.HeldTokens == 0 || res.Pages[0] != held[0].Page {
		t.Fatalf("the second reservation holds %v (%d tokens) from the cache, pages %v", held, res.HeldTokens, res.Pages)
	}
	page := held[0].Page
	if in := p.dPool.Info(page); in.State != kvpool.PageShared || in.Owner == r.r.Owner() {
		t.Fatalf("held page %d is %s, tagged %v", page, in.State, in.Owner)
	}
	sum, ok := cache.Checksum(held[0].Key, page)
	if !ok {
		t.Fatalf("held page %d has no checksum in the cache", page)
	}
	refused("a page held from the prefix cache", res, page)
	if got, ok := cache.Checksum(held[0].Key, page); !ok || got != sum || transfer.Checksum(pageContents(t, p.dPool, page, 4)) != sum {
		t.Fatalf("held page %d is no longer what was cached under its key", page)
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "owner_tag"); n != 2 {
		t.Fatalf("the frame into a held page counted under reason=owner_tag: %v in all, want 2", n)
	}
	abort(res)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		st := p.dPool.Stats()
		if st.Free+st.Cached == st.Total && st.Quarantined == 0 {
			if st.ReleaseErrors != 0 {
				t.Fatalf("pool bookkeeping: %+v", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pages not released: %+v", st)
		}
	}
}

// A frame whose token count is not its page's (3 tokens into a full
// 4-token prompt page) is refused when it lands, counted under
// reason=bad_count, and writes nothing: without the check, only Commit's
// coverage would notice, later and under another name.
func TestFrameTokenCountChecked(t *testing.T) {
	want := loadRef(t)
	p := newPair(t, 4, 512)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := p.dc.Reserve(ctx, &pdv1.ReserveRequest{RequestId: "short", Prompt: longPrompt(want, 13), Sampling: &pdv1.SamplingParams{MaxTokens: 2},
		Layout: p.layout, Writer: p.prefillAddr})
	if err != nil {
		t.Fatal(err)
	}
	page := res.Pages[0]
	before := pageContents(t, p.dPool, page, 4)
	sess := openSession(t, ctx, res)
	if err := sess.Write(transfer.PageWrite{Index: 0, Page: page, Tokens: 3, Data: ones(p.dPool, 3)}); err != nil {
		t.Fatal(err)
	}
	if err := sess.Flush(ctx); err == nil {
		t.Fatal("a 3-token frame into a full 4-token prompt page was accepted")
	}
	if got := pageContents(t, p.dPool, page, 4); !bytes.Equal(got, before) {
		t.Fatal("the refused frame changed the page's bytes")
	}
	if n := labelled(t, p.dm, "baton_handoff_failures_total", "reason", "bad_count"); n != 1 {
		t.Fatalf("the frame was counted %v times under reason=bad_count, want 1", n)
	}
	_ = sess.Close()
	if _, err := p.dc.Abort(ctx, &pdv1.AbortRequest{Room: res.Room, Epoch: res.Epoch, Reason: "test over", Capability: res.Capability}); err != nil {
		t.Fatal(err)
	}
}
