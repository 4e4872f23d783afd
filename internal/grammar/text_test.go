package grammar

import (
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
)

const arithmeticGBNF = `
# integer arithmetic with parentheses
root   ::= expr
expr   ::= term (("+" | "-") term)*
term   ::= factor (("*" | "/") factor)*
factor ::= number | "(" expr ")"
number ::= "-"? [0-9]+
`

// arith reports whether s is in the language of arithmeticGBNF, by
// recursive descent.
func arith(s string) bool {
	pos := 0
	var expr func() bool
	factor := func() bool {
		if pos < len(s) && s[pos] == '(' {
			pos++
			if !expr() || pos >= len(s) || s[pos] != ')' {
				return false
			}
			pos++
			return true
		}
		if pos < len(s) && s[pos] == '-' {
			pos++
		}
		start := pos
		for pos < len(s) && s[pos] >= '0' && s[pos] <= '9' {
			pos++
		}
		return pos > start
	}
	chain := func(sub func() bool, ops string) bool {
		if !sub() {
			return false
		}
		for pos < len(s) && strings.IndexByte(ops, s[pos]) >= 0 {
			pos++
			if !sub() {
				return false
			}
		}
		return true
	}
	term := func() bool { return chain(factor, "*/") }
	expr = func() bool { return chain(term, "+-") }
	return expr() && pos == len(s)
}

func TestGBNFSamples(t *testing.T) {
	cases := []struct {
		name, src string
		member    func(string) bool
	}{
		{"arithmetic", arithmeticGBNF, arith},
		{"list", `root ::= "[" item ("," " "? item){0,4} "]"
item ::= "\"" [a-zA-Z_ äöü]{1,10} "\"" | ("yes" | "no")`,
			regexp.MustCompile(`^\[("[a-zA-Z_ äöü]{1,10}"|yes|no)(, ?("[a-zA-Z_ äöü]{1,10}"|yes|no)){0,4}\]$`).MatchString},
		{"lines", `root ::= line+
line ::= [^\n#]{1,20} "\n"   # any short line
`, regexp.MustCompile(`^([^\n#]{1,20}\n)+$`).MatchString},
		{"escapes", `root ::= "\x41\u00e9\t" [\x30-\x39]? .`, regexp.MustCompile("^A\u00e9\t[0-9]?(?s:.)$").MatchString},
	}
	for _, tc := range cases {
		g, err := FromGBNF(tc.src)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		for _, vn := range testVocabs {
			c := mustCompile(t, g, loadTok(t, vn))
			rng := rand.New(rand.NewPCG(9, uint64(len(tc.name))))
			done := 0
			for range 10 {
				ids, ok := sample(t, c, rng, 300)
				if !ok {
					continue
				}
				done++
				if s := c.v.text(ids); !tc.member(s) {
					t.Errorf("%s/%s: %q is not in the language", tc.name, vn, s)
				}
			}
			if done == 0 {
				t.Errorf("%s/%s: no sample finished", tc.name, vn)
			}
		}
	}
}

func TestRegexSamples(t *testing.T) {
	for _, p := range []string{
		`[a-z]+@[a-z]+\.(com|org)`,
		`\d{3}-\d{4}`,
		`^(yes|no|maybe)$`,
		`(?i)hello( world)?!*`,
		`[^\x00-\x7f]{1,3}x`,
		`.{2,5}\.`,
		`(\+|-)?\d+(\.\d+)?([eE]\d+)?`,
		`a{0}b|c`,
		`(?s:.)[\p{Greek}]+`,
	} {
		g, err := FromRegex(p)
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		re := regexp.MustCompile(`^(?:` + p + `)$`)
		for _, vn := range testVocabs {
			c := mustCompile(t, g, loadTok(t, vn))
			rng := rand.New(rand.NewPCG(2, uint64(len(p))))
			done := 0
			for range 10 {
				ids, ok := sample(t, c, rng, 200)
				if !ok {
					continue
				}
				done++
				if s := c.v.text(ids); !re.MatchString(s) {
					t.Errorf("%s/%s: %q does not match", p, vn, s)
				}
			}
			if done == 0 {
				t.Errorf("%s/%s: no sample finished", p, vn)
			}
		}
	}
}

func TestRegexAcceptsMatches(t *testing.T) {
	c := mustCompile(t, mustRegex(t, `(ab|a)*c{2,3}`), loadTok(t, "stories260K"))
	for s, want := range map[string]bool{"cc": true, "abacc": true, "ccc": true, "c": false, "cccc": false, "abbcc": false, "": false} {
		if got := acceptText(c, s, true) == nil; got != want {
			t.Errorf("%q: got %v, want %v", s, got, want)
		}
	}
}

func mustRegex(t *testing.T, p string) *Grammar {
	t.Helper()
	g, err := FromRegex(p)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func TestGrammarErrors(t *testing.T) {
	for _, src := range []string{
		``,
		`root ::= "a`,
		`root ::= [a-`,
		`root ::= (a`,
		`root ::= missing`,
		`root ::= root "a"`, // left recursion
		`root ::= a
a ::= "x"? root`, // left recursion through a nullable prefix
		`root ::= "a"{3,2}`,
		`root ::= "a" root ::= "b"`,
		`root ::= "a"
root ::= "b"`,
		`start ::= "a"`, // no root
		`root ::= "\xZZ"`,
		`root ::= %`,
	} {
		if _, err := FromGBNF(src); err == nil {
			t.Errorf("FromGBNF(%q) succeeded", src)
		}
	}
	for _, p := range []string{`a\bb`, `(?m)a$b`, `a^b`, `(`} {
		if _, err := FromRegex(p); err == nil {
			t.Errorf("FromRegex(%q) succeeded", p)
		}
	}
}

func TestCache(t *testing.T) {
	tok := loadTok(t, "stories260K")
	cache := NewCache(2)
	a, err := cache.Get(KindJSONSchema, testSchemas["flat"], tok)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := cache.Get(KindJSONSchema, testSchemas["flat"], tok)
	if a != b {
		t.Fatal("the same schema compiled twice")
	}
	if o1, _ := cache.Get(KindJSONObject, "x", tok); o1 == nil {
		t.Fatal("json_object failed")
	} else if o2, _ := cache.Get(KindJSONObject, "y", tok); o1 != o2 {
		t.Fatal("json_object compiled once per spec")
	}
	if _, err := cache.Get(KindRegex, `(`, tok); err == nil {
		t.Fatal("bad regex compiled")
	}
	if cache.Len() != 2 {
		t.Fatalf("cache holds %d, want its bound 2", cache.Len())
	}
	if _, err := cache.Get("xml", "", tok); err == nil {
		t.Fatal("unknown kind accepted")
	}
	// Scopes (tenants) never share an entry: another scope's first use
	// compiles anew, however warm the schema is elsewhere.
	scoped := NewCache(8)
	x, _ := scoped.GetScoped("tenant-a", KindJSONSchema, testSchemas["flat"], tok)
	y, _ := scoped.GetScoped("tenant-b", KindJSONSchema, testSchemas["flat"], tok)
	x2, _ := scoped.GetScoped("tenant-a", KindJSONSchema, testSchemas["flat"], tok)
	if x == nil || x == y || x != x2 || scoped.Len() != 2 {
		t.Fatalf("scoped entries: a %p, b %p, a again %p, %d held", x, y, x2, scoped.Len())
	}
	for _, kind := range []string{KindJSONObject, KindJSONSchema, KindRegex, KindEBNF} {
		spec := map[string]string{KindJSONSchema: realisticSchema, KindRegex: `\d+`, KindEBNF: arithmeticGBNF}[kind]
		c, err := ForRequest(kind, spec, tok)
		if err != nil || c == nil {
			t.Fatalf("%s: %v", kind, err)
		}
	}
}

// TestNullableRepeats: nullable parts repeated reach the same frames by
// exponentially many routes; each is expanded once, so this stays cheap.
func TestNullableRepeats(t *testing.T) {
	g, err := FromGBNF(`root ::= ("0"* | "1"?){0,2}{12} "x"`)
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, loadTok(t, "stories260K"))
	for s, want := range map[string]bool{"x": true, "0001110x": true, "1111111111111111111111111x": false, "0000": false} {
		if got := acceptText(c, s, true) == nil; got != want {
			t.Errorf("%q: got %v, want %v", s, got, want)
		}
	}
}
