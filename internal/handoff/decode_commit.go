package handoff

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
	"github.com/batonlm/baton/internal/transfer"
)

// Commit is the writer's claim that the prompt's KV is in the pages.
type Commit struct {
	Room, Epoch   uint64
	Capability    []byte
	SessionID     []byte
	Writer        string
	TokensWritten int
	PageChecksums []uint64
	// FirstToken is the token prefill sampled; nil fails the first_token
	// check.
	FirstToken *request.Sampled
	// PromptLogprobs gives the prompt's logprobs, at most limit of them.
	PromptLogprobs func(limit int) []request.Sampled
	CachedTokens   int
}

// Commit checks every claim of the handoff before the request may decode.
// Any failed check fails the request (its client sees a 5xx naming the
// check) and is counted. ctx bounds the wait for held pages still loading.
func (d *Decode) Commit(ctx context.Context, c Commit) error {
	err, ok := call(&d.inbox, d.commitEvent(ctx, c))
	if !ok {
		return errStopped
	}
	return err
}

func (d *Decode) commitEvent(ctx context.Context, c Commit) func(answer func(error)) {
	return func(answer func(error)) { d.commit(ctx, c, answer) }
}

// commit runs on the desk in three turns: the lease revoked and the
// request Verifying (no write lands from here on), the checks on a
// goroutine of their own, then the batch or the failure.
func (d *Decode) commit(ctx context.Context, c Commit, answer func(error)) {
	key := roomKey(c.Room, c.Epoch)
	res := d.find("Commit", c.Room, c.Epoch, c.Capability)
	if res == nil {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		tracing.FailCtx(ctx, "no_reservation")
		answer(refuse(NotFound, "no live reservation for %s", key))
		return
	}
	if !res.lease.boundTo(c.SessionID, d.o.Guards.SessionBound) {
		// Refused without touching the reservation: its own writer's
		// Commit may still come.
		d.authFailure("Commit")
		tracing.FailCtx(ctx, "session_bind")
		answer(refuse(Denied, "commit for %s does not come from the session that wrote its pages", key))
		return
	}
	d.on(res, func() {
		first := res.firstByte
		res.lease.revoke()
		tracing.Span(ctx, tracing.SpanLanded, first, time.Now(), tracing.AttrPages.Int(len(c.PageChecksums)))
		if err := res.ho.CommitArrived(); err != nil {
			d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
			tracing.FailCtx(ctx, "late")
			answer(refuse(Precondition, "reservation %s is %s; commit dropped", key, res.r.State()))
			return
		}
		// The checks read the pages: the request takes no other event (an
		// abort, the timer) until they end, so its pages are not released
		// under them.
		var reason string
		var err error
		d.await(res, func() {
			vctx, span := tracing.Start(ctx, tracing.SpanVerify)
			reason, err = d.check(vctx, res, c)
			traceVerified(span, reason, err)
			if err != nil {
				tracing.FailCtx(ctx, reason)
			}
		}, func() {
			d.verified(res, c, first, reason, err, answer)
		})
	})
}

// check waits for held pages still loading, then verifies, off the desk:
// the checksums take time, and nothing writes the pages any more.
func (d *Decode) check(ctx context.Context, res *reservation, c Commit) (string, error) {
	// Pages the reservation holds from the cache's lower tiers may still
	// be loading: the held-page check waits for their loads to end (or
	// for the caller to give up, and then refuses them as not ready), so
	// it never reads one before it is.
	if done := res.r.LoadsDone(); done != nil {
		select {
		case <-done:
		default:
			d.o.Metrics.HiCacheLoadWaits.Inc()
			select {
			case <-done:
			case <-ctx.Done():
			}
		}
	}
	return d.verify(res, c)
}

// verified acts on Commit's checks: the request fails, or joins the batch.
func (d *Decode) verified(res *reservation, c Commit, first time.Time, reason string, err error, answer func(error)) {
	key := roomKey(c.Room, c.Epoch)
	if err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues(reason).Inc()
		res.log.Warn("commit refused", "room", key.Room, "check", reason, "err", err)
		res.ho.End(reason, fmt.Errorf("KV handoff failed the %s check: %w", reason, err))
		answer(refuse(Precondition, "commit refused by the %s check: %v", reason, err))
		return
	}
	if res.r.Params.PromptLogprobs && c.PromptLogprobs != nil {
		res.r.SetPromptLogprobs(c.PromptLogprobs(len(res.r.Prompt) - 1))
	}
	// Reported, never trusted: the pages were shipped and checked like the
	// rest; the count only goes into the client's usage.
	res.r.SetCachedTokens(min(c.CachedTokens, len(res.r.Prompt)))
	joinErr := res.ho.Verified(*c.FirstToken)
	if joinErr != nil {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		answer(refuse(Precondition, "reservation %s: %v", key, joinErr))
		return
	}
	d.await(res, func() { joinErr = d.o.Engine.Enqueue(res.r) }, func() {
		if joinErr != nil {
			// The engine stopped, or an abort ended it first.
			res.ho.End("the engine did not take the request: "+joinErr.Error(), joinErr)
			d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
			answer(refuse(Precondition, "reservation %s: %v", key, joinErr))
			return
		}
		res.joined = true
		res.timer.Stop()
		if !first.IsZero() {
			d.o.Metrics.TransferSeconds.Observe(time.Since(first).Seconds())
		}
		res.log.Info("committed", "room", key.Room, "tokens", c.TokensWritten)
		answer(nil)
	})
}

// verify checks a Commit against the pages: tokens written equal tokens
// reserved, one checksum per page, every page tagged as this request's and
// written as far as the prompt reaches, and each checksum equal to the
// checksum of what actually landed.
func (d *Decode) verify(res *reservation, c Commit) (string, error) {
	n := len(res.r.Prompt)
	if c.Writer != res.writer {
		return "writer", fmt.Errorf("commit from %q, the reservation's writer is %q", c.Writer, res.writer)
	}
	if reason, err := d.o.Guards.TokenCoverage(c.TokensWritten, n); err != nil {
		return reason, err
	}
	switch {
	case len(c.PageChecksums) != len(res.prompt):
		return "coverage", fmt.Errorf("%d page checksums for %d pages", len(c.PageChecksums), len(res.prompt))
	case c.FirstToken == nil:
		return "first_token", errors.New("no first token")
	}
	ps := d.o.Pool.PageSize()
	var buf []byte
	// A one-sided transport's pages that landed in the pool itself are
	// proven with the transport's Sums where it has its own (ucx into a
	// registered GPU pool: kernels.PageSum on the device), batched with the
	// rest: nothing is read back, and they are marked written only once
	// every one matched.
	batchOneSided := d.oneSided && d.o.Sums != nil && d.o.Landing.Data == nil
	// The shipped pages whose checksums are left to check, read back in
	// one pass at the end (one wait for a GPU pool, not one a page).
	var sumIndex []int
	var sumPages []int32
	var sumTokens []int
	held := res.r.Held()
	for i, p := range res.prompt {
		want := min(ps, n-i*ps)
		if i < len(held) {
			// A page decode held from its cache: nobody shipped it, and
			// the Commit's claim for it is not read. What is checked is
			// that it is still the page cached under the key this prompt
			// reaches, pinned by this request, unchanged since it was
			// cached.
			d.o.Faults.Held(d.o.Pool, p)
			var err error
			if buf, err = d.o.Guards.HeldRecheck(d.o.Pool, res.r, held[i], p, buf); err != nil {
				return "held_page", err
			}
			continue
		}
		if err := d.o.Guards.OwnerTag(d.o.Pool, res.r, res.prompt, i, p); err != nil {
			return "owner_tag", err
		}
		if batchOneSided {
			sumIndex, sumPages, sumTokens = append(sumIndex, i), append(sumPages, p), append(sumTokens, want)
			continue
		}
		if d.oneSided {
			var err error
			if buf, err = d.provenOneSided(res, p, want, c.PageChecksums[i], buf); err != nil {
				return "checksum", err
			}
			if err := d.o.Pool.MarkWritten(res.r.Owner(), p, want); err != nil {
				return "coverage", err
			}
			continue
		}
		d.o.Faults.Landed(d.o.Pool, p, want)
		if err := d.o.Guards.PageCoverage(d.o.Pool, p, want); err != nil {
			return "coverage", err
		}
		sumIndex, sumPages, sumTokens = append(sumIndex, i), append(sumPages, p), append(sumTokens, want)
	}
	if len(sumPages) == 0 {
		return "", nil
	}
	sums := d.o.Sums
	if sums == nil {
		sums = transfer.HostSums
	}
	got, err := sums(d.o.Pool.KV(), sumPages, sumTokens)
	if err != nil {
		return "checksum", fmt.Errorf("checksumming pages %v: %w", sumPages, err)
	}
	for j, i := range sumIndex {
		if claim := c.PageChecksums[i]; !d.o.Guards.ChecksumMatches(got[j], claim) {
			return "checksum", fmt.Errorf("page %d checksum %016x, commit claims %016x", sumPages[j], got[j], claim)
		}
	}
	if batchOneSided {
		// No frame marked them: what landed is proven now, every page.
		for j, p := range sumPages {
			if err := d.o.Pool.MarkWritten(res.r.Owner(), p, sumTokens[j]); err != nil {
				return "coverage", err
			}
		}
	}
	return "", nil
}

// provenOneSided checks a page no frame marked: what landed is proven by
// its checksum over the page contents, and copied into the pool when it
// landed elsewhere.
func (d *Decode) provenOneSided(res *reservation, p int32, want int, claim uint64, buf []byte) ([]byte, error) {
	kv := d.o.Pool.KV()
	landed := kv
	if d.o.Landing.Data != nil {
		landed = d.o.Landing
	}
	buf, err := checkLanded(landed, p, want, claim, buf, d.o.Guards.ChecksumMatches)
	if err != nil {
		return buf, err
	}
	if d.o.Landing.Data != nil {
		// The verified bytes, not the landing zone again: a late write
		// there cannot slip in between check and copy.
		if err := transfer.Unpack(kv, p, want, buf); err != nil {
			return buf, fmt.Errorf("copying verified page %d into the pool: %w", p, err)
		}
	}
	return buf, nil
}

// checkHeld is Commit's check of a page the reservation holds from the
// prefix cache, the held_recheck check (DecodeGuards.HeldRecheck): the page
// is the one pinned at Reserve, still shared under its key with r's pin
// (the read gate's own question), and its contents still have the checksum
// recorded when it was cached. It sits in verify's order of checks, where
// no wrapper reaches.
func (d *Decode) checkHeld(pool *kvpool.Pool, r *scheduler.Request, ref kvpool.SharedRef, page int32, buf []byte) ([]byte, error) {
	ps := pool.PageSize()
	if page != ref.Page {
		return buf, fmt.Errorf("held page %d is not the page %d pinned at Reserve", page, ref.Page)
	}
	if err := pool.CheckReadable(r.Owner(), []int32{page}, ps); err != nil {
		return buf, err
	}
	if in := pool.Info(page); in.State != kvpool.PageShared {
		return buf, fmt.Errorf("held page %d is %s", page, in.State)
	}
	if d.o.Cache == nil {
		return buf, fmt.Errorf("held page %d without a prefix cache", page)
	}
	sum, ok := d.o.Cache.Checksum(ref.Key, page)
	if !ok {
		return buf, fmt.Errorf("held page %d is no longer cached under its key", page)
	}
	buf, err := transfer.ReadPage(pool.KV(), page, ps, buf)
	if err != nil {
		return buf, fmt.Errorf("reading held page %d back: %w", page, err)
	}
	if got := transfer.Checksum(buf); got != sum {
		// Nobody may read it again.
		d.o.Cache.Drop(ref)
		return buf, fmt.Errorf("held page %d checksum %016x, %016x when it was cached", page, got, sum)
	}
	return buf, nil
}

// checkLanded reads back the first tokens slots of page as they are in the
// pool (device memory included) and compares their checksum with the
// commit's claim by matches, the checksum check (DecodeGuards.ChecksumMatches:
// it needs the bytes read back here, which nothing outside the desk has).
// buf is reused.
func checkLanded(kv kernels.PagedKV, page int32, tokens int, claim uint64, buf []byte, matches func(got, claim uint64) bool) ([]byte, error) {
	buf, err := transfer.ReadPage(kv, page, tokens, buf)
	if err != nil {
		return buf, fmt.Errorf("reading page %d back: %w", page, err)
	}
	if got := transfer.Checksum(buf); !matches(got, claim) {
		return buf, fmt.Errorf("page %d checksum %016x, commit claims %016x", page, got, claim)
	}
	return buf, nil
}

// tokensCovered and pageCovered are Commit's coverage check, the coverage
// guard's two halves (DecodeGuards.TokenCoverage, PageCoverage): the
// tokens it claims are the tokens reserved (fewer is a short write, more
// an over-claim), and each prompt page holds as many written tokens as the
// prompt reaches into it. They sit inside verify's order of checks,
// between the writer and the checksums and between a page's owner tag and
// its checksum, and the order decides which check a failure is counted
// under, so a wrapper around Commit could not drop them without running
// the others again.
func tokensCovered(written, reserved int) (string, error) {
	switch {
	case written < reserved:
		return "coverage", fmt.Errorf("%d tokens written, %d reserved", written, reserved)
	case written > reserved:
		return "over_claim", fmt.Errorf("%d tokens claimed, only %d reserved", written, reserved)
	}
	return "", nil
}

func (*Decode) pageCovered(pool *kvpool.Pool, page int32, want int) error {
	if _, written, _ := pool.Owner(page); written != want {
		return fmt.Errorf("page %d holds %d written tokens, %d needed", page, written, want)
	}
	return nil
}
