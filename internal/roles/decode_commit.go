package roles

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
)

// Commit implements the RPC: it checks every claim of the handoff before the
// request may decode. Any failed check fails the request (its client sees a
// 5xx naming the check) and is counted.
func (d *Decode) Commit(ctx context.Context, c *pdv1.CommitRequest) (*pdv1.Ack, error) {
	key := roomKey(c.Room, c.Epoch)
	res := d.find("Commit", c.Room, c.Epoch, c.Capability)
	if res == nil {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		return nil, status.Errorf(codes.NotFound, "no live reservation for %s", key)
	}
	if !d.fromBoundSession(res, c.SessionId) {
		// Refused without touching the reservation: its own writer's
		// Commit may still come.
		d.authFailure("Commit")
		return nil, status.Errorf(codes.PermissionDenied, "commit for %s does not come from the session that wrote its pages", key)
	}
	res.mu.Lock()
	first := res.firstByte
	// Nothing lands from here on: writes are checked against the state
	// under res.mu.
	err := res.r.Lifecycle().Move([]scheduler.State{scheduler.StateReserved, scheduler.StateReceiving}, scheduler.StateVerifying, "")
	res.mu.Unlock()
	if err != nil {
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "reservation %s is %s; commit dropped", key, res.r.State())
	}
	if reason, err := d.verify(res, c); err != nil {
		d.o.Metrics.HandoffFailures.WithLabelValues(reason).Inc()
		d.o.Log.Warn("commit refused", "request_id", res.r.ID, "room", key.Room, "check", reason, "err", err)
		d.o.Engine.FailReserved(res.r, fmt.Errorf("KV handoff failed the %s check: %w", reason, err))
		d.maybeEnd(res)
		return nil, status.Errorf(codes.FailedPrecondition, "commit refused by the %s check: %v", reason, err)
	}
	if err := res.r.Lifecycle().Move([]scheduler.State{scheduler.StateVerifying}, scheduler.StateCommitted, ""); err != nil {
		// An abort ended it while its pages were checked.
		d.o.Metrics.LateDropped.WithLabelValues("commit").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "reservation %s: %v", key, err)
	}
	res.timer.Stop()
	if !first.IsZero() {
		d.o.Metrics.TransferSeconds.Observe(time.Since(first).Seconds())
	}
	if res.r.Params.PromptLogprobs {
		res.r.SetPromptLogprobs(TokensFromPB(c.PromptLogprobs, len(res.r.Prompt)-1))
	}
	if err := d.o.Engine.Join(res.r, TokenFromPB(c.FirstToken)); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	d.o.Log.Info("committed", "request_id", res.r.ID, "room", key.Room, "tokens", c.TokensWritten)
	return &pdv1.Ack{}, nil
}

// fromBoundSession says whether a Commit names the transfer session that
// decode admitted for res (the only one that may have written its pages).
func (d *Decode) fromBoundSession(res *reservation, id []byte) bool {
	if !faults.On(faults.GuardSessionBind) {
		return true
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	return res.bound && len(id) == len(res.key.Session) && subtle.ConstantTimeCompare(res.key.Session[:], id) == 1
}

// verify checks a Commit against the pages: tokens written equal tokens
// reserved, one checksum per page, every page tagged as this request's and
// written as far as the prompt reaches, and each checksum equal to the
// checksum of what actually landed.
func (d *Decode) verify(res *reservation, c *pdv1.CommitRequest) (string, error) {
	n := len(res.r.Prompt)
	coverage := faults.On(faults.GuardCoverage)
	switch {
	case c.Writer != res.writer:
		return "writer", fmt.Errorf("commit from %q, the reservation's writer is %q", c.Writer, res.writer)
	case coverage && int(c.TokensWritten) < n:
		return "coverage", fmt.Errorf("%d tokens written, %d reserved", c.TokensWritten, n)
	case coverage && int(c.TokensWritten) > n:
		return "over_claim", fmt.Errorf("%d tokens claimed, only %d reserved", c.TokensWritten, n)
	case len(c.PageChecksums) != len(res.prompt):
		return "coverage", fmt.Errorf("%d page checksums for %d pages", len(c.PageChecksums), len(res.prompt))
	case c.FirstToken == nil:
		return "first_token", errors.New("no first token")
	}
	ps := d.o.Pool.PageSize()
	kv := d.o.Pool.KV()
	var buf []byte
	for i, p := range res.prompt {
		want := min(ps, n-i*ps)
		owner, written, st := d.o.Pool.Owner(p)
		if faults.On(faults.GuardOwnerTag) && (owner != res.r.Owner() || st != kvpool.PageAllocated) {
			return "owner_tag", fmt.Errorf("page %d is tagged %v (%s), not %v", p, owner, st, res.r.Owner())
		}
		if d.oneSided {
			// No frame marked anything: what landed is proven by its
			// checksum over the page contents, then marked written.
			landed := kv
			if d.o.Landing.Data != nil {
				landed = d.o.Landing
			}
			var err error
			if buf, err = checkLanded(landed, p, want, c.PageChecksums[i], buf); err != nil {
				return "checksum", err
			}
			if d.o.Landing.Data != nil {
				// The verified bytes, not the landing zone again: a late
				// write there cannot slip in between check and copy.
				if err := transfer.Unpack(kv, p, want, buf); err != nil {
					return "checksum", fmt.Errorf("copying verified page %d into the pool: %w", p, err)
				}
			}
			if err := d.o.Pool.MarkWritten(res.r.Owner(), p, want); err != nil {
				return "coverage", err
			}
			continue
		}
		if coverage && written != want {
			return "coverage", fmt.Errorf("page %d holds %d written tokens, %d needed", p, written, want)
		}
		if !coverage && written < want {
			// Without the coverage guard the pages count as written (the
			// read gate would refuse them otherwise): the incident's shape.
			_ = d.o.Pool.MarkWritten(res.r.Owner(), p, want)
		}
		var err error
		if buf, err = checkLanded(kv, p, want, c.PageChecksums[i], buf); err != nil {
			return "checksum", err
		}
	}
	return "", nil
}

// checkLanded reads back the first tokens slots of page as they are in the
// pool (device memory included) and compares their checksum with the
// commit's claim. buf is reused.
func checkLanded(kv kernels.PagedKV, page int32, tokens int, claim uint64, buf []byte) ([]byte, error) {
	buf, err := transfer.ReadPage(kv, page, tokens, buf)
	if err != nil {
		return buf, fmt.Errorf("reading page %d back: %w", page, err)
	}
	if got := transfer.Checksum(buf); faults.On(faults.GuardChecksum) && got != claim {
		return buf, fmt.Errorf("page %d checksum %016x, commit claims %016x", page, got, claim)
	}
	return buf, nil
}
