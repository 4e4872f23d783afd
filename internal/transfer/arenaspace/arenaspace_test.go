package arenaspace

import "testing"

// The arena's bytes go first fit, come back coalesced, and a staging that
// finds no room is counted (its pages then go another way).
func TestSpace(t *testing.T) {
	s := &Space{free: []Span{{0, 4 * Align}}}
	a, ok := s.take(2 * Align)
	b, ok2 := s.take(Align)
	if !ok || !ok2 || a != (Span{0, 2 * Align}) || b != (Span{2 * Align, 3 * Align}) {
		t.Fatalf("took %v %v (%v %v)", a, b, ok, ok2)
	}
	if _, ok := s.take(2 * Align); ok {
		t.Fatal("took 2 units with 1 free")
	}
	if st := s.Stats(); st.FellBack != 1 {
		t.Fatalf("fellBack %d, want 1", st.FellBack)
	}
	s.give([]Span{a})
	s.Release([]Span{b}, nil, true, 0)
	if len(s.free) != 1 || s.free[0] != (Span{0, 4 * Align}) || s.Stats().FreeBytes != 4*Align {
		t.Fatalf("free list %v after giving everything back", s.free)
	}
	if c, ok := s.take(4 * Align); !ok || c.Off != 0 {
		t.Fatalf("the whole arena after coalescing: %v %v", c, ok)
	}
}
