package tcp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/batonlm/baton/internal/transfer"
)

// fuzzSink refuses some writes so that acks carry text too.
type fuzzSink struct {
	t      *testing.T
	max    int
	writes int
}

func (s *fuzzSink) Write(_ transfer.Key, w transfer.PageWrite) error {
	if len(w.Data) > s.max || w.Index < 0 || w.Tokens < 0 {
		s.t.Fatalf("Sink got a write outside the limits: index %d, tokens %d, %d bytes", w.Index, w.Tokens, len(w.Data))
	}
	s.writes++
	if w.Tokens%2 == 1 {
		return errors.New("odd")
	}
	return nil
}

func (s *fuzzSink) Closed(transfer.Key, string) {}

// Admit refuses sessions whose room is odd, so refused sessions are
// fuzzed too.
func (s *fuzzSink) Admit(k transfer.Key) ([]int32, error) {
	if k.Room%2 == 1 {
		return nil, errors.New("odd room")
	}
	return nil, nil
}

// FuzzFrame feeds arbitrary bytes to a receiver's frame processing (and to
// the sender's ack reader): it must never panic, never pass the Sink a
// write outside the limits, and never hold a buffer past the payload
// limit. (TestLazyPayloadAlloc checks that a claimed length alone does not
// allocate; a large limit here would only slow the fuzzer down.)
func FuzzFrame(f *testing.F) {
	hello := frame(frameHello, capSize, 3, 4, 0, make([]byte, capSize))
	valid := bytes.Join([][]byte{
		hello,
		frame(framePage, 8, 0, 5, 2, []byte{1, 2, 3, 4, 5, 6, 7, 8}),
		frame(framePage, 4, 1, 6, 1, []byte{1, 2, 3, 4}),
		frame(frameFlush, 0, 1, 0, 0, nil),
		frame(framePage, 0, 2, 1<<32-1, 0, nil),
		frame(frameFlush, 0, 2, 0, 0, nil),
	}, nil)
	f.Add(valid)
	f.Add(valid[:len(valid)-5])
	f.Add(hello)
	f.Add(append(append([]byte{}, hello...), frame(framePage, 1<<30, 0, 0, 0, nil)...))
	f.Add(append(append([]byte{}, hello...), frame(framePage, 3000, 0, 0, 0, make([]byte, 100))...))
	f.Add(frame(frameAck, 5, 1, 10, 0, []byte("error")))
	f.Add([]byte{magic, version, framePage, 0, 0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{})
	f.Add(bytes.Join([][]byte{hello, frame(frameArena, 64, 0, 0, 0, make([]byte, 64)), frame(frameRef, 8, 0, 5, 2, make([]byte, 8)), frame(frameFlush, 0, 1, 0, 0, nil)}, nil))
	f.Add(bytes.Join([][]byte{hello, frame(frameRef, 8, 0, 5, 2, []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})}, nil))

	const maxPayload = 4096
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg := newConfig([]Option{WithMaxPayload(maxPayload)})
		sink := &fuzzSink{t: t, max: maxPayload}
		st := &connState{cfg: &cfg, sink: sink}
		hellos := 0
		err := st.serveFrames(bufio.NewReader(bytes.NewReader(in)), io.Discard, func(transfer.Key) { hellos++ })
		if hellos > 1 {
			t.Fatalf("hello called %d times", hellos)
		}
		if err == nil && hellos != 1 {
			t.Fatalf("clean end without a HELLO")
		}
		if cap(st.buf) > maxPayload {
			t.Fatalf("receive buffer of %d bytes, limit %d", cap(st.buf), maxPayload)
		}
		// The sender's side of the wire: acks only, no page payloads.
		var (
			hdr [hdrSize]byte
			buf []byte
		)
		r := bytes.NewReader(in)
		for {
			h, payload, keep, err := readFrame(r, &hdr, buf, 0)
			buf = keep
			if err != nil {
				break
			}
			if len(payload) != h.length || (h.typ == frameAck && h.length > maxAckText) || (h.typ == framePage && h.length > 0) {
				t.Fatalf("frame type %d with %d payload bytes passed the checks", h.typ, len(payload))
			}
		}
		if cap(buf) > maxAckText {
			t.Fatalf("ack buffer of %d bytes, limit %d", cap(buf), maxAckText)
		}
	})
}
