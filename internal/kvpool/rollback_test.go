package kvpool

import "testing"

func written(p *Pool, pages []int32) []int {
	var w []int
	for _, id := range pages {
		_, n, _ := p.Owner(id)
		w = append(w, n)
	}
	return w
}

func TestRollbackLowersOwnPages(t *testing.T) {
	p := newPool(t, 8, false)
	a := mustAlloc(t, p, 1, 3)
	if err := p.MarkPositions(a.Owner, a.Pages, 10); err != nil {
		t.Fatal(err)
	}
	if err := p.Rollback(a.Owner, a.Pages, 5); err != nil {
		t.Fatal(err)
	}
	if got := written(p, a.Pages); got[0] != 4 || got[1] != 1 || got[2] != 0 {
		t.Fatalf("written counts after rollback to 5: %v, want [4 1 0]", got)
	}
	// The read gate sees the rejected positions as unwritten.
	if err := p.CheckReadable(a.Owner, a.Pages, 5); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.CheckReadable(a.Owner, a.Pages, 6), ErrNotWritten)
	for _, id := range a.Pages {
		if o, _, st := p.Owner(id); o != a.Owner || st != PageAllocated {
			t.Fatalf("page %d after rollback: owner %v state %v", id, o, st)
		}
	}
	// Rolling forward again is an ordinary mark.
	if err := p.MarkPositions(a.Owner, a.Pages, 7); err != nil {
		t.Fatal(err)
	}
	if err := p.CheckReadable(a.Owner, a.Pages, 7); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.RollbackRefusals != 0 {
		t.Fatalf("refusals %d", st.RollbackRefusals)
	}
	checkInvariants(t, p)
}

func TestRollbackRefusesOthersPages(t *testing.T) {
	p := newPool(t, 8, false)
	a := mustAlloc(t, p, 1, 2)
	b := mustAlloc(t, p, 2, 2)
	if err := p.MarkPositions(a.Owner, a.Pages, 8); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.Rollback(b.Owner, a.Pages, 2), ErrWrongOwner)
	// A table mixing the caller's pages with another's: refused whole.
	mixed := []int32{b.Pages[0], a.Pages[1]}
	if err := p.MarkPositions(b.Owner, b.Pages[:1], 4); err != nil {
		t.Fatal(err)
	}
	wantErr(t, p.Rollback(b.Owner, mixed, 2), ErrWrongOwner)
	if got := written(p, a.Pages); got[0] != 4 || got[1] != 4 {
		t.Fatalf("another owner's rollback changed %v", got)
	}
	if got := written(p, b.Pages[:1]); got[0] != 4 {
		t.Fatalf("a refused rollback changed the caller's page: %v", got)
	}
	wantErr(t, p.Rollback(a.Owner, a.Pages, -1), ErrBadArg)
	if st := p.Stats(); st.RollbackRefusals != 3 {
		t.Fatalf("refusals %d, want 3", st.RollbackRefusals)
	}
	checkInvariants(t, p)
}

func TestRollbackNeverTouchesSharedPages(t *testing.T) {
	p := newPool(t, 8, false)
	a, _ := published(t, p, 1, 2, 0)
	wantErr(t, p.Rollback(a.Owner, a.Pages, 2), ErrShared)
	if got := written(p, a.Pages); got[0] != 4 || got[1] != 4 {
		t.Fatalf("a shared page was lowered: %v", got)
	}
	// Rolling back to past the shared prefix leaves it alone and is fine.
	if err := p.Rollback(a.Owner, a.Pages, 8); err != nil {
		t.Fatal(err)
	}
	if st := p.Stats(); st.RollbackRefusals != 1 {
		t.Fatalf("refusals %d, want 1", st.RollbackRefusals)
	}
	checkInvariants(t, p)
}
