package tokenizer

import "strings"

// specialMark is U+FDD0, a Unicode noncharacter (reserved for a program's
// own use, never text): EscapeSpecial puts it in front of a control
// token's text to say "this is text", and doubles one found in the text.
const specialMark = "\uFDD0"

// EscapeSpecial marks, in text a client wrote, every place a control or
// unknown token's text starts (and doubles any mark already there), so
// that EncodeEscaped, which parses the control tokens of the text around
// it, spells these out as text. It is how a chat template's own markup
// becomes control tokens while the same markup in a message stays text:
// the messages are escaped before the template renders them, and the
// rendered prompt is encoded with EncodeEscaped (llama.cpp's parse_special
// and Hugging Face's split_special_tokens, applied to the client's text
// only). The mark goes in front of the token rather than inside it, so
// that a template testing or splitting the text at a token still finds
// it. Text that holds neither a control token nor a mark is returned as
// it is.
func (t *Tokenizer) EscapeSpecial(text string) string {
	var b *strings.Builder
	for i := 0; i < len(text); {
		mark := strings.HasPrefix(text[i:], specialMark)
		if !mark && !t.controlAt(text, i) {
			if b != nil {
				b.WriteByte(text[i])
			}
			i++
			continue
		}
		if b == nil {
			b = &strings.Builder{}
			b.Grow(len(text) + 2*len(specialMark))
			b.WriteString(text[:i])
		}
		b.WriteString(specialMark)
		if mark {
			b.WriteString(specialMark)
			i += len(specialMark)
			continue
		}
		b.WriteByte(text[i])
		i++
	}
	if b == nil {
		return text
	}
	return b.String()
}

// controlAt reports whether the text of a control or unknown token starts
// at text[i].
func (t *Tokenizer) controlAt(text string, i int) bool {
	for _, id := range t.controlByFirst[text[i]] {
		if strings.HasPrefix(text[i:], t.tokens[id]) {
			return true
		}
	}
	return false
}

// EncodeEscaped is Encode with parseSpecial for a text in which
// EscapeSpecial escaped what came from clients: control tokens are parsed
// except where marked, and the marks are taken out of the text before it
// is encoded. For any string s, EncodeEscaped(t.EscapeSpecial(s), add)
// equals Encode(s, add, false).
func (t *Tokenizer) EncodeEscaped(text string, addSpecial bool) []int32 {
	return t.encode(text, addSpecial, true, true)
}

// UnescapedLen is the length of text once its marks are taken out, at
// most: what a bound on the tokens of the text should count.
func UnescapedLen(text string) int {
	return len(text) - strings.Count(text, specialMark)*len(specialMark)
}

// marked reports whether the token found at text[at] was marked as text
// by EscapeSpecial: an odd run of marks precedes it (an even run is marks
// the client wrote, doubled).
func marked(text string, at int) bool {
	n := 0
	for at >= len(specialMark) && text[at-len(specialMark):at] == specialMark {
		n++
		at -= len(specialMark)
	}
	return n%2 == 1
}

// unescape takes EscapeSpecial's marks out of text: a pair is the mark
// the client wrote, a single one goes.
func unescape(text string) string {
	if !strings.Contains(text, specialMark) {
		return text
	}
	var b strings.Builder
	b.Grow(len(text))
	for {
		i := strings.Index(text, specialMark)
		if i < 0 {
			b.WriteString(text)
			return b.String()
		}
		b.WriteString(text[:i])
		text = text[i+len(specialMark):]
		if strings.HasPrefix(text, specialMark) {
			b.WriteString(specialMark)
			text = text[len(specialMark):]
		}
	}
}
