package tokenizer

import (
	"strings"
	"unicode/utf8"
)

// StreamDecoder turns generated tokens into text one token at a time.
// Byte-fallback and byte-level tokens can split a multi-byte character
// across tokens, so the tail of an incomplete character is held back until
// the token that completes it arrives. Every chunk returned is valid UTF-8,
// and the chunks of a sequence concatenate to Decode of that sequence.
// A StreamDecoder is not safe for concurrent use.
type StreamDecoder struct {
	t       *Tokenizer
	pending []byte
}

// NewStreamDecoder starts decoding a new sequence of generated tokens.
func (t *Tokenizer) NewStreamDecoder() *StreamDecoder {
	return &StreamDecoder{t: t}
}

// Push adds one token and returns the text it completes, possibly "".
// Control tokens and out-of-range ids add nothing.
func (d *StreamDecoder) Push(id int32) string {
	if id < 0 || int(id) >= len(d.t.pieces) || d.t.IsControl(id) {
		return ""
	}
	d.pending = append(d.pending, d.t.pieces[id]...)
	return d.drain(false)
}

// Flush returns whatever is held back, with an unfinished character
// replaced by U+FFFD (one per byte), and resets the decoder.
func (d *StreamDecoder) Flush() string {
	return d.drain(true)
}

// drain emits the longest prefix of pending whose decoding cannot change
// with more input. A byte that can never start or continue a valid
// character becomes U+FFFD right away; utf8.FullRune tells the two cases
// apart, so the stream makes exactly the same choices as one pass over the
// whole text would.
func (d *StreamDecoder) drain(final bool) string {
	p := d.pending
	var sb strings.Builder
	i := 0
	for i < len(p) {
		if !final && !utf8.FullRune(p[i:]) {
			break
		}
		r, n := utf8.DecodeRune(p[i:])
		if r == utf8.RuneError && n == 1 {
			sb.WriteRune(utf8.RuneError)
		} else {
			sb.Write(p[i : i+n])
		}
		i += n
	}
	d.pending = append(d.pending[:0], p[i:]...)
	return sb.String()
}
