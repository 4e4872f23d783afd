package toolcall

import "testing"

// BenchmarkLongAnswer streams a long answer without calls (8000 pieces of
// about 4 bytes) through each parser: the cost of auto tool choice on
// ordinary text.
func BenchmarkLongAnswer(b *testing.B) {
	piece := "word"
	for _, f := range Formats {
		b.Run(f, func(b *testing.B) {
			for range b.N {
				p, _ := New(f)
				for range 8000 {
					p.Push(piece)
				}
				p.Finish()
			}
		})
	}
}
