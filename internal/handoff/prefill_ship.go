package handoff

import (
	"cmp"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/transfer"
)

// shipper packs completed pages on the engine loop (so local pages can be
// released as soon as the prompt is done) and writes them to the session
// on its own goroutine (so a slow network never stalls the engine). Where
// the session stages on the device (cuda-ipc, ucx with an arena) the
// engine loop only queues the packs; the goroutine waits for them, off the
// engine loop, before it writes the pages and records their checksums.
type shipper struct {
	pages     []int32 // decode's pages, by prompt page
	pageSize  int
	promptLen int
	// heldPages lead the prompt in decode's prefix cache: not shipped.
	heldPages int
	// checksums are the shipped pages' sums, by prompt page: written by
	// the writing goroutine, read after finish.
	checksums []uint64
	// sess stages pages itself where it can (transfer.Stager: cuda-ipc,
	// ucx with an arena).
	sess transfer.Session
	// shipped counts pages by where they go from (metrics.PagesShipped).
	shipped *prometheus.CounterVec
	queue   chan shipBatch
	done    chan error
	firstAt time.Time // when the first page was queued (engine loop only, read after finish)
	packErr error     // a page that could not be read from the pool (engine loop only, read after finish)
	// traced: marks records each chunk's end (engine loop only, read
	// after the request's last event) for the chunks' spans (trace.go).
	traced bool
	marks  []chunkMark
}

// shipBatch is one chunk's pages, staged: prompt page index[j] is the
// staging's page j, of tokens[j] tokens.
type shipBatch struct {
	staged transfer.Staged
	index  []int
	tokens []int
}

func newShipper(t Ticket, pageSize, promptLen int, sess transfer.Session, shipped *prometheus.CounterVec) *shipper {
	s := &shipper{pages: t.Pages, pageSize: pageSize, promptLen: promptLen, heldPages: t.HeldTokens / pageSize, checksums: make([]uint64, len(t.Pages)), sess: sess, shipped: shipped,
		queue: make(chan shipBatch, len(t.Pages)), done: make(chan error, 1)}
	go func() {
		var first error
		for b := range s.queue {
			// Waited for even once the session failed: the wait frees
			// what the staging holds.
			sums, err := b.staged.Wait()
			if err != nil {
				first = cmp.Or(first, fmt.Errorf("staging pages %d-%d of the prompt: %w", b.index[0], b.index[len(b.index)-1], err))
				continue
			}
			for j, i := range b.index {
				s.checksums[i] = sums[j]
				if first == nil {
					first = sess.Write(b.staged.Write(j, i, s.pages[i], b.tokens[j]))
				}
			}
		}
		s.done <- first
	}()
	return s
}

// onChunk runs on the engine loop after positions [from, to) were computed;
// it ships every page this completed (the last, partial page with the
// prompt's end). The queue holds a batch per page of the prompt, more than
// it is ever given, so it never blocks.
func (s *shipper) onChunk(kv kernels.PagedKV, pages []int32, from, to int) {
	if s.traced {
		s.marks = append(s.marks, chunkMark{from: from, to: to, at: time.Now()})
	}
	if s.packErr != nil {
		return
	}
	// The pages this chunk completed, read in one pass (one wait for a
	// GPU pool's copies rather than one a page).
	var index []int
	var local []int32
	var tokens []int
	for i := from / s.pageSize; i*s.pageSize < to; i++ {
		end := min((i+1)*s.pageSize, s.promptLen)
		if to < end || i >= len(s.pages) {
			break
		}
		if i < s.heldPages {
			continue // decode holds it already
		}
		index, local, tokens = append(index, i), append(local, pages[i]), append(tokens, end-i*s.pageSize)
	}
	if len(index) == 0 {
		return
	}
	staged, err := transfer.StagePages(s.sess, kv, local, tokens)
	if err != nil {
		s.packErr = fmt.Errorf("reading pages %d-%d of the prompt: %w", index[0], index[len(index)-1], err)
		return
	}
	source := "host"
	if staged.Srcs != nil {
		source = "device"
	}
	if s.shipped != nil {
		s.shipped.WithLabelValues(source).Add(float64(len(index)))
	}
	if s.firstAt.IsZero() {
		s.firstAt = time.Now()
	}
	s.queue <- shipBatch{staged: staged, index: index, tokens: tokens}
}

// finish waits until every queued page was handed to the session.
func (s *shipper) finish() error {
	close(s.queue)
	if err := <-s.done; err != nil {
		return err
	}
	return s.packErr
}
