package scheduler

import (
	"reflect"
	"testing"
)

// plan only reads: planning a step twice gives the same batch, and leaves
// every request's state and the pool as they were; begin is what moves a
// request into the step.
func TestPlanOnlyReads(t *testing.T) {
	e, _ := manualEngine(t)
	want := loadRef(t)
	a := NewRequest("a", want.PromptIDs, Params{MaxTokens: 4})
	b := NewRequest("b", want.PromptIDs[:3], Params{MaxTokens: 4})
	for _, r := range []*Request{a, b} {
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	e.takeInbox()
	e.admit()
	e.prepare()
	free := e.pool.Free()
	p1, p2 := e.plan(), e.plan()
	if !reflect.DeepEqual(p1.batch, p2.batch) || len(p1.members) != 2 || len(p1.refused) != 0 {
		t.Fatalf("two plans differ or miss a member: %+v / %+v", p1, p2)
	}
	for _, r := range []*Request{a, b} {
		if r.State() != StateAdmitted || r.computed != 0 {
			t.Errorf("request %s: %s with %d computed after planning, want Admitted with 0", r.ID, r.State(), r.computed)
		}
	}
	if e.pool.Free() != free {
		t.Errorf("planning changed the pool: %d free, was %d", e.pool.Free(), free)
	}
	if got, want := len(p1.batch.Tokens), len(a.Prompt)+len(b.Prompt); got != want {
		t.Errorf("%d rows planned, want both prompts whole (%d)", got, want)
	}
	e.begin(p1)
	if a.State() != StatePrefilling || b.State() != StatePrefilling {
		t.Errorf("after begin: %s, %s, want Prefilling", a.State(), b.State())
	}
}

// The chunk budget is shared in running order: with ChunkSize below two
// prompts together, the first takes what it needs and the second the rest.
func TestPlanSharesTheChunkBudget(t *testing.T) {
	e, _ := manualEngine(t)
	e.cfg.ChunkSize = 8
	prompt := []int32{1, 400, 401, 402, 403, 404}
	a := NewRequest("a", prompt[:5], Params{MaxTokens: 2})
	b := NewRequest("b", prompt[:6], Params{MaxTokens: 2})
	for _, r := range []*Request{a, b} {
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	e.takeInbox()
	e.admit()
	e.prepare()
	p := e.plan()
	if len(p.members) != 2 || p.batch.Seqs[0].QLen != 5 || p.batch.Seqs[1].QLen != 3 {
		t.Fatalf("plan %+v, want 5 rows of a then 3 of b", p.batch.Seqs)
	}
}

// Each role's traits are what its loop needs.
func TestRoleTraits(t *testing.T) {
	for role, want := range map[Role]roleTraits{
		RoleStandalone: {computesPrompts: true, preempts: true},
		RolePrefill:    {handsOn: true, computesPrompts: true},
		RoleDecode:     {},
	} {
		if got := traitsOf(role); got != want {
			t.Errorf("%s: %+v, want %+v", role, got, want)
		}
	}
}
