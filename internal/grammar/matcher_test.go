package grammar

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// TestMaskMatchesAccept checks the cached masks against the definition:
// along random paths, a token's bit is set exactly when Accept takes it.
// Every token of the vocabulary is tried, so a context cached wrongly
// (a token accepted or refused regardless of the stack below when it
// should not be) shows up.
func TestMaskMatchesAccept(t *testing.T) {
	grammars := map[string]func() (*Grammar, error){
		"realistic": func() (*Grammar, error) { return FromJSONSchema(realisticSchema) },
		"recursive": func() (*Grammar, error) { return FromJSONSchema(testSchemas["recursive"]) },
		"json":      func() (*Grammar, error) { return JSONObject(), nil },
		"regex":     func() (*Grammar, error) { return FromRegex(`(ab|a)*c{2,3}[x-z]?|\d+(\.\d+)?`) },
		"gbnf":      func() (*Grammar, error) { return FromGBNF(arithmeticGBNF) },
	}
	vocabs := testVocabs
	steps := 25
	if testing.Short() {
		vocabs = []string{"stories260K", "llama-spm"}
		steps = 10
	}
	for name, mk := range grammars {
		g, err := mk()
		if err != nil {
			t.Fatal(name, err)
		}
		for _, vn := range vocabs {
			c := mustCompile(t, g, loadTok(t, vn))
			rng := rand.New(rand.NewPCG(11, uint64(len(name))))
			m := c.NewMatcher()
			mask := make([]uint64, c.MaskWords())
			var path []int32
			for step := 0; step < steps && !m.IsTerminated(); step++ {
				m.FillMask(mask)
				var allowed []int32
				for id := int32(0); int(id) < c.VocabSize(); id++ {
					err := m.Accept(id)
					if (err == nil) != maskHas(mask, id) {
						t.Fatalf("%s/%s after %q: token %d %q: mask %v, Accept error %v",
							name, vn, c.v.text(path), id, c.v.bytes[id], maskHas(mask, id), err)
					}
					if err == nil {
						allowed = append(allowed, id)
						if err := m.Rollback(1); err != nil {
							t.Fatal(err)
						}
					}
				}
				if len(allowed) == 0 {
					break
				}
				// Prefer short tokens so paths go deep into the grammar.
				pick := allowed[rng.IntN(len(allowed))]
				for range 3 {
					if p := allowed[rng.IntN(len(allowed))]; len(c.v.bytes[p]) < len(c.v.bytes[pick]) {
						pick = p
					}
				}
				if err := m.Accept(pick); err != nil {
					t.Fatal(err)
				}
				path = append(path, pick)
			}
		}
	}
}

// TestMaskDeepStacks checks masks against Accept on stacks deeper than the
// cached contexts, where the uncertain tokens are walked against the
// frames below.
func TestMaskDeepStacks(t *testing.T) {
	g, err := FromGBNF(`root ::= "(" root ")" | "[" root "]," | "x" | "(" "x"* ")" | "\"" [^"]* "\""`)
	if err != nil {
		t.Fatal(err)
	}
	for _, vn := range []string{"stories260K", "llama-spm"} {
		c := mustCompile(t, g, loadTok(t, vn))
		m := c.NewMatcher()
		mask := make([]uint64, c.MaskWords())
		prefix := `((([[(([(("ab`
		for i := 0; i < len(prefix); i++ {
			var id int32 = -1
			for tid, b := range c.v.bytes {
				if len(b) == 1 && b[0] == prefix[i] {
					id = int32(tid)
					break
				}
			}
			if err := m.Accept(id); err != nil {
				t.Fatalf("%s: %q: %v", vn, prefix[:i+1], err)
			}
			if i < len(prefix)-5 {
				continue
			}
			m.FillMask(mask)
			n := 0
			for tid := int32(0); int(tid) < c.VocabSize(); tid++ {
				err := m.Accept(tid)
				if (err == nil) != maskHas(mask, tid) {
					t.Fatalf("%s after %q: token %q: mask %v, Accept %v", vn, prefix[:i+1], c.v.bytes[tid], maskHas(mask, tid), err)
				}
				if err == nil {
					n++
					_ = m.Rollback(1)
				}
			}
			if n == 0 {
				t.Fatalf("%s: nothing allowed", vn)
			}
		}
		deepest := int32(0)
		for _, f := range m.stacks {
			if f != nil {
				deepest = max(deepest, f.depth)
			}
		}
		if deepest <= ctxFrames {
			t.Fatalf("%s: stacks only %d deep", vn, deepest)
		}
	}
}

func TestAcceptRefuses(t *testing.T) {
	tok := loadTok(t, "llama-spm")
	g, err := FromJSONSchema(`{"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]}`)
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, tok)
	m := c.NewMatcher()
	id := func(s string) int32 {
		t.Helper()
		ids := tok.Encode(s, false, false)
		if len(ids) != 1 {
			t.Fatalf("%q is %d tokens", s, len(ids))
		}
		return ids[0]
	}
	mustRefuse := func(tid int32) {
		t.Helper()
		before := m.Accepted()
		if err := m.Accept(tid); !errors.Is(err, ErrRejected) {
			t.Fatalf("token %d %q accepted (%v)", tid, tok.TokenText(tid), err)
		}
		if m.Accepted() != before {
			t.Fatal("a refused token changed the state")
		}
	}
	mustRefuse(tok.EOS())   // the grammar cannot end yet
	mustRefuse(tok.BOS())   // control tokens never match
	mustRefuse(-1)          // out of range
	mustRefuse(id("hello")) // not JSON
	mustRefuse(id("["))     // not an object
	for _, s := range []string{"{", "\"", "n", "\":", "1", "2"} {
		tid, ok := tok.TokenID(s)
		if !ok {
			t.Fatalf("no token %q", s)
		}
		if err := m.Accept(tid); err != nil {
			t.Fatalf("%q: %v", s, err)
		}
	}
	mustRefuse(id("a"))   // letters in an integer
	mustRefuse(tok.EOS()) // the object is open
	tid, _ := tok.TokenID(",")
	mustRefuse(tid) // no more properties
	tid, _ = tok.TokenID("}")
	if err := m.Accept(tid); err != nil {
		t.Fatal(err)
	}
	if !m.CanEnd() {
		t.Fatal("cannot end after a complete object")
	}
	mask := make([]uint64, c.MaskWords())
	m.FillMask(mask)
	if got := maskList(mask); len(got) == 0 || !maskHas(mask, tok.EOS()) {
		t.Fatalf("after the object the mask is %v, want the end tokens", got)
	}
	for _, x := range maskList(mask) {
		if !tok.IsEOG(x) {
			t.Fatalf("token %d %q allowed after the end", x, tok.TokenText(x))
		}
	}
	if err := m.Accept(tok.EOS()); err != nil {
		t.Fatal(err)
	}
	if !m.IsTerminated() {
		t.Fatal("not terminated after EOS")
	}
	mustRefuse(tid)
	m.FillMask(mask)
	if len(maskList(mask)) != 0 {
		t.Fatal("tokens allowed after termination")
	}
	// Rolling back the end and the brace reopens the object.
	if err := m.Rollback(2); err != nil {
		t.Fatal(err)
	}
	if m.IsTerminated() || m.CanEnd() {
		t.Fatal("rollback did not restore the state")
	}
	three, _ := tok.TokenID("3")
	if err := m.Accept(three); err != nil {
		t.Fatal(err)
	}
	if err := m.Rollback(100); err == nil {
		t.Fatal("rollback past the start succeeded")
	}
}

// TestRollbackReplays checks that rolling back and accepting the same
// tokens again gives the same masks.
func TestRollbackReplays(t *testing.T) {
	g, err := FromJSONSchema(realisticSchema)
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, loadTok(t, "gpt-2"))
	rng := rand.New(rand.NewPCG(5, 5))
	ids, _ := sample(t, c, rng, 200)
	m := c.NewMatcher()
	masks := make([][]uint64, len(ids))
	for i, id := range ids {
		masks[i] = make([]uint64, c.MaskWords())
		m.FillMask(masks[i])
		if err := m.Accept(id); err != nil {
			t.Fatal(err)
		}
	}
	k := len(ids) / 2
	if err := m.Rollback(len(ids) - k); err != nil {
		t.Fatal(err)
	}
	mask := make([]uint64, c.MaskWords())
	for i := k; i < len(ids); i++ {
		m.FillMask(mask)
		for w := range mask {
			if mask[w] != masks[i][w] {
				t.Fatalf("mask %d differs after rollback", i)
			}
		}
		if err := m.Accept(ids[i]); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAmbiguousGivesUp: a grammar with exponentially many parse stacks
// makes the matcher stop with an error instead of hanging.
func TestAmbiguousGivesUp(t *testing.T) {
	var sb strings.Builder
	sb.WriteString("root ::= r0 \"x\"\n")
	for i := range 30 {
		fmt.Fprintf(&sb, "r%d ::= r%d r%d\n", i, i+1, i+1)
	}
	sb.WriteString("r30 ::= \"y\"?\n")
	g, err := FromGBNF(sb.String())
	if err != nil {
		t.Fatal(err)
	}
	tok := loadTok(t, "stories260K")
	if _, err := Compile(g, tok); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Compile: %v", err)
	}
	if _, err := ForRequest(KindEBNF, sb.String(), tok); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("ForRequest: %v", err)
	}
	// The same behind a first byte: the blow-up comes in the first mask.
	g, err = FromGBNF(strings.Replace(sb.String(), `root ::= r0`, `root ::= "a" r0`, 1))
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, tok)
	m := c.NewMatcher()
	mask := make([]uint64, c.MaskWords())
	m.FillMask(mask)
	if !errors.Is(m.Err(), ErrAmbiguous) {
		t.Fatalf("Err after FillMask: %v", m.Err())
	}
	for _, id := range maskList(mask) {
		if !tok.IsEOG(id) {
			t.Fatalf("token %d allowed after giving up", id)
		}
	}
	if err := m.Accept('a'); !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("Accept after giving up: %v", err)
	}
	if err := m.Accept(tok.EOS()); err != nil || !m.IsTerminated() {
		t.Fatalf("Accept of the end after giving up: %v", err)
	}
}

// TestConcurrentMatchers runs matchers of one Compiled in parallel while
// its context cache is still filling (run with -race).
func TestConcurrentMatchers(t *testing.T) {
	g, err := FromJSONSchema(realisticSchema)
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, loadTok(t, "stories260K"))
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 3))
			m := c.NewMatcher()
			mask := make([]uint64, c.MaskWords())
			for range 300 {
				m.FillMask(mask)
				allowed := maskList(mask)
				if len(allowed) == 0 || m.IsTerminated() {
					return
				}
				if err := m.Accept(allowed[rng.IntN(len(allowed))]); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
