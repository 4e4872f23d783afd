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
	prepared(t, e, a, b)
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
	prepared(t, e, a, b)
	p := e.plan()
	if len(p.members) != 2 || p.batch.Seqs[0].QLen != 5 || p.batch.Seqs[1].QLen != 3 {
		t.Fatalf("plan %+v, want 5 rows of a then 3 of b", p.batch.Seqs)
	}
}

// prepared enqueues rs on e (whose loop does not run) and takes them up to
// the plan: admitted, each one's own business done.
func prepared(t *testing.T, e *Engine, rs ...*Request) {
	t.Helper()
	for _, r := range rs {
		if err := e.Enqueue(r); err != nil {
			t.Fatal(err)
		}
	}
	e.takeInbox()
	e.admit()
	e.prepare()
}

// An engine takes requests of its own role, and a decode engine standalone
// ones too (prompts its worker computes itself); any other is refused
// before it is queued, whatever it carries.
func TestEngineTakesItsRoles(t *testing.T) {
	mk := func(role Role) *Engine {
		e, _ := manualEngine(t)
		e.cfg.Role = role
		return e
	}
	prompt := loadRef(t).PromptIDs
	for _, c := range []struct {
		engine, request Role
		takes           bool
	}{
		{RoleStandalone, RoleStandalone, true},
		{RoleStandalone, RolePrefill, false},
		{RolePrefill, RolePrefill, true},
		{RolePrefill, RoleStandalone, false},
		{RoleDecode, RoleStandalone, true},
		{RoleDecode, RolePrefill, false},
	} {
		e := mk(c.engine)
		r := NewRoleRequest(c.request, "r", prompt, Params{MaxTokens: 4})
		err := e.Enqueue(r)
		if queued := len(e.inbox) == 1; (err == nil) != c.takes || queued != c.takes {
			t.Errorf("a %s engine given a %s request: %v, queued %v; want taken %v", c.engine, c.request, err, queued, c.takes)
		}
	}
}
