package tokenizer

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
)

// Fingerprint names what the tokenizer does: a hash of its vocabulary,
// token types, scores and merges, the tokens it adds, and its chat
// template. Two processes that must agree on token ids (a router and the
// workers it sends ids to) compare fingerprints rather than file names.
func (t *Tokenizer) Fingerprint() string {
	t.fpOnce.Do(func() {
		h := sha256.New()
		num := func(v int64) { _ = binary.Write(h, binary.LittleEndian, v) }
		str := func(s string) { num(int64(len(s))); h.Write([]byte(s)) }
		num(int64(t.kind))
		str(t.model)
		num(int64(len(t.tokens)))
		for i, s := range t.tokens {
			str(s)
			num(int64(t.types[i]))
			if i < len(t.scores) {
				num(int64(math.Float32bits(t.scores[i])))
			}
		}
		keys := make([]mergeKey, 0, len(t.merges))
		for k := range t.merges {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b mergeKey) int { return int(t.merges[a]) - int(t.merges[b]) })
		for _, k := range keys {
			str(k.left)
			str(k.right)
		}
		for _, v := range []int32{t.bos, t.eos, t.eot, t.eom, t.unk} {
			num(int64(v))
		}
		for _, b := range []bool{t.addBOS, t.addEOS, t.addSpacePrefix, t.cleanSpaces, t.ignoreMerges} {
			if b {
				num(1)
			} else {
				num(0)
			}
		}
		str(t.chatTemplate)
		t.fp = hex.EncodeToString(h.Sum(nil)[:12])
	})
	return t.fp
}
