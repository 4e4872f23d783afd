//go:build faults

package roles

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/batonlm/baton/internal/faults"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/transfer"
)

// The workers' guards that BATON_GUARDS_OFF can switch off, each by
// replacing the one variable its check goes through with what a worker
// without the check would do. Only this file, built with the faults tag,
// assigns them; the comment on each variable says why the guard is a
// variable rather than a wrapper.
func init() {
	off := func(g string) bool { return !faults.On(g) }
	if off(faults.GuardLateDrop) {
		// A frame for a reservation gone lands where it points, whoever
		// holds the page now.
		lateWrite = func(d *Decode, w transfer.PageWrite, _ error) error {
			if w.Page < 0 || int(w.Page) >= d.o.Pool.NumPages() || w.Tokens <= 0 || w.Tokens > d.o.Pool.PageSize() {
				return fmt.Errorf("page %d outside the pool", w.Page)
			}
			return transfer.Unpack(d.o.Pool.KV(), w.Page, w.Tokens, w.Data)
		}
	}
	if off(faults.GuardOwnerTag) {
		// Any page of the pool is taken at its word; only the pool's bounds
		// keep the frame from writing past the KV.
		ownerTag = func(d *Decode, _ *reservation, index int, page int32) error {
			if page < 0 || int(page) >= d.o.Pool.NumPages() || index < 0 {
				return fmt.Errorf("page %d outside the pool", page)
			}
			return nil
		}
	}
	check := recheckHeld
	if off(faults.GuardHeldRecheck) {
		check = func(_ *Decode, _ *reservation, _ kvpool.SharedRef, _ int32, buf []byte) ([]byte, error) {
			return buf, nil
		}
	}
	recheckHeld = check
	if sp := faults.Active(); sp != nil && sp.HeldCorrupt {
		// The held page changes while cached (a stray write, a bad bit):
		// its first values are negated just before Commit looks at it.
		recheckHeld = func(d *Decode, res *reservation, ref kvpool.SharedRef, page int32, buf []byte) ([]byte, error) {
			if data := d.o.Pool.PageData(page); data != nil {
				for i := range min(len(data), 64) {
					data[i] = -data[i] - 1
				}
			}
			return check(d, res, ref, page, buf)
		}
	}
	if off(faults.GuardSessionBind) {
		sessionBound = func(*reservation, []byte) bool { return true }
	}
	if off(faults.GuardCoverage) {
		// The claim is believed; the pages' written counts stay what
		// landed, so the read gate (unless it is off too: the incident's
		// shape) still sees the truth.
		coverage.tokens = func(int, int) (string, error) { return "", nil }
		coverage.page = func(*Decode, *reservation, int32, int) error { return nil }
	}
	if off(faults.GuardChecksum) {
		checksumMatches = func(uint64, uint64) bool { return true }
	}
	if off(faults.GuardCapability) {
		capabilityMatches = func(transfer.Capability, []byte) bool { return true }
	}
	if off(faults.GuardPeerQuota) {
		overQuota = func(*Decode, *peerUse, int) bool { return false }
	}
	if off(faults.GuardDrainWait) {
		// The writer is still asked to stop, but its pages are reused
		// without waiting for its answer.
		askToDrain = func(d *Decode, res *reservation, why string) {
			go d.tellWriter(res, why)
			d.writerGone(res, false, "drain wait switched off")
		}
	}
	if off(faults.GuardDialKnown) {
		dialKnown = func(*Prefill, string) bool { return true }
	}
	if sp := faults.Active(); sp != nil && sp.FlattenLanded {
		// Each landed prompt page's written slots become 1.0 just before
		// Commit checks the page: after the handoff, before the checksum.
		covered := coverage.page
		coverage.page = func(d *Decode, res *reservation, page int32, want int) error {
			kv := d.o.Pool.KV()
			if buf, err := transfer.ReadPage(kv, page, want, nil); err == nil && kv.DType == kernels.F32 {
				for i := 0; i+4 <= len(buf); i += 4 {
					binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(1))
				}
				_ = transfer.Unpack(kv, page, want, buf)
			}
			return covered(d, res, page, want)
		}
	}
}
