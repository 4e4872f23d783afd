package roles

import (
	"context"
	"testing"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/transfer"
	"github.com/batonlm/baton/internal/transfer/tcp"
)

// found is a reservation as a test sees it through the desk.
type found struct {
	r           *scheduler.Request
	d           *Decode
	room, epoch uint64
}

// find looks a reservation up on d's desk, as the tests' way to reach its
// request.
func (d *Decode) find(_ string, room, epoch uint64, _ []byte) *found {
	r, _, ok := d.desk.Lookup(room, epoch)
	if !ok {
		return nil
	}
	return &found{r: r, d: d, room: room, epoch: epoch}
}

// claimed says whether a Stream took the reservation's events.
func (f *found) claimed() bool {
	_, streamed, _ := f.d.desk.Lookup(f.room, f.epoch)
	return streamed
}

// landZeros opens a writer's session for res and lands every page full
// (zeros: finite KV whose checksums are known), for a Commit to claim.
func landZeros(t *testing.T, ctx context.Context, p *pair, res *pdv1.Reservation) (transfer.Session, []uint64) {
	t.Helper()
	sess, err := tcp.NewSender().Open(ctx, res.TransferAddr, resKey(res))
	if err != nil {
		t.Fatal(err)
	}
	ps := int(p.layout.PageSize)
	var sums []uint64
	for i, pg := range res.Pages {
		tokens := min(ps, int(res.PromptTokens)-i*ps)
		data := make([]byte, transfer.PackedSize(p.dPool.KV(), tokens))
		if err := sess.Write(transfer.PageWrite{Index: i, Page: pg, Tokens: tokens, Data: data}); err != nil {
			t.Fatal(err)
		}
		sums = append(sums, transfer.Checksum(data))
	}
	if err := sess.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	return sess, sums
}
