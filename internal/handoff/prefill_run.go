package handoff

import (
	"context"
	"time"

	"github.com/batonlm/baton/internal/request"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/tracing"
)

// Run prefills prompt into decode's reservation t and hands it over: the
// door, a session to the reservation, the chunks shipped as they complete,
// flush, close, Commit, Sent. It runs on the caller's goroutine (the
// Prefill RPC's), which waits on the engine and on decode; the desk makes
// the request's moves and keeps it in its table until Run returns, where an
// Abort finds it. Every way out but Sent tells decode Drained.
func (d *Prefill) Run(ctx context.Context, id string, t Ticket, prompt []int32, params request.Params) (Sent, error) {
	key := t.Key
	log := tracing.Log(d.o.Log.With("request_id", id, "room", key.Room, "epoch", key.Epoch), ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if !d.enter(key, cancel) {
		d.drained(id, t.DecodeAddr, key)
		return Sent{}, refuse(Stopped, "the prefill worker is stopping")
	}
	defer d.leave(key)

	r := scheduler.NewRoleRequest(scheduler.RolePrefill, id, prompt, params)
	// The door first: a request this worker cannot hold is rejected before
	// any session to decode exists.
	if err := d.o.Engine.CheckDoor(r); err != nil {
		log.Info("prefill refused", "err", err)
		d.drained(id, t.DecodeAddr, key)
		return Sent{}, err
	}
	sess, err := d.o.Sender.Open(ctx, t.TransferAddr, key)
	if err != nil {
		d.end(id, r, nil, t, "transport open failed")
		return Sent{}, refuse(Unavailable, "cannot reach decode transport %s: %v", t.TransferAddr, err)
	}
	d.o.Metrics.TransferSessions.Inc()
	ship := newShipper(t, d.o.Pool.PageSize(), len(prompt), sess, d.o.Metrics.PagesShipped)
	ship.traced = tracing.Enabled()
	r.OnChunk = ship.onChunk
	if err := d.o.Engine.Enqueue(r); err != nil {
		_ = sess.Close()
		_ = ship.finish()
		d.drained(id, t.DecodeAddr, key)
		return Sent{}, err
	}
	start := time.Now()

	ev, ok := r.Next(ctx)
	for ok && ev.Finish == "" {
		ev, ok = r.Next(ctx)
	}
	ship.trace(ctx, start, r, ok)
	if !ok || ev.Finish != scheduler.FinishPrefilled {
		why := "prefill aborted"
		if ok && ev.Err != nil {
			why = ev.Err.Error()
		}
		if !ok {
			// The caller left before the engine ended r: ask it to, and
			// wait until it has let go (no more pages will be queued).
			// A last event read above already says it has.
			r.Cancel()
			waitLast(r)
		}
		_ = sess.Close()
		_ = ship.finish()
		d.end(id, r, nil, t, why)
		if !ok {
			return Sent{}, refuse(Canceled, "%s", why)
		}
		return Sent{}, &Refusal{Kind: Failed, Msg: why, Err: ev.Err}
	}
	// Every write must have landed before Commit claims it did.
	err = ship.finish()
	ship.traceShipped(ctx, err)
	if err == nil {
		fctx, span := tracing.Start(ctx, tracing.SpanPrefillFlush)
		err = sess.Flush(fctx)
		tracing.End(span, err)
	}
	if err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues("transfer").Inc()
		d.end(id, r, sess, t, err.Error())
		return Sent{}, refuse(Unavailable, "KV transfer failed: %v", err)
	}
	bytes := sess.Bytes()
	tracing.Annotate(ctx, tracing.AttrBytes.Int64(bytes))
	_ = sess.Close()
	d.o.Metrics.TransferBytes.Add(float64(bytes))
	d.o.Metrics.TransferSeconds.Observe(time.Since(ship.firstAt).Seconds())

	err = d.o.Decoders.Commit(ctx, t.DecodeAddr, id, Claim{Key: key, Session: sess.ID(), TokensWritten: len(prompt), PageChecksums: ship.checksums,
		First: ev.Token, Prompt: ev.Prompt, CachedTokens: ev.CachedTokens})
	if err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues("commit").Inc()
		d.end(id, r, nil, t, "commit refused")
		log.Warn("commit refused", "err", err)
		return Sent{}, &Refusal{Kind: Refused, Msg: "commit refused by decode: " + err.Error(), Err: err}
	}
	d.call(func() { err = r.Lifecycle().To(scheduler.StateSent, "") })
	if err != nil {
		d.o.Metrics.IllegalMoves.Inc()
		log.Error("prefill request not Sent", "err", err)
		return Sent{}, refuse(Internal, "%s", err.Error())
	}
	d.o.Metrics.Outcome("sent")
	log.Info("prefilled and committed", "tokens", len(prompt), "bytes", bytes, "seconds", time.Since(start).Seconds())
	return Sent{TokensWritten: len(prompt), FirstToken: ev.Token.ID}, nil
}

// waitLast reads r's events until its last (the engine has torn it down).
func waitLast(r *scheduler.Request) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		ev, ok := r.Next(ctx)
		if !ok || ev.Finish != "" {
			return
		}
	}
}
