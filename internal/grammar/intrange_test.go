package grammar

import (
	"fmt"
	"strconv"
	"testing"
)

// TestIntegerBounds checks every integer from -1500 to 1500 (and a few
// non-canonical spellings) against schemas with bounds.
func TestIntegerBounds(t *testing.T) {
	tok := loadTok(t, "stories260K")
	none := noBound
	cases := []struct {
		schema string
		lo, hi int64
	}{
		{`"minimum":0,"maximum":150`, 0, 150},
		{`"minimum":-37,"maximum":1234`, -37, 1234},
		{`"minimum":-1000,"maximum":-7`, -1000, -7},
		{`"minimum":18`, 18, none},
		{`"maximum":99`, none, 99},
		{`"maximum":-120`, none, -120},
		{`"minimum":-5`, -5, none},
		{`"exclusiveMinimum":0,"exclusiveMaximum":10`, 1, 9},
		{`"minimum":0.5,"maximum":7.9`, 1, 7},
		{`"minimum":100,"maximum":100`, 100, 100},
		{`"minimum":109,"maximum":1091`, 109, 1091},
	}
	for _, tc := range cases {
		g, err := FromJSONSchema(`{"type":"integer",` + tc.schema + `}`)
		if err != nil {
			t.Fatal(tc.schema, err)
		}
		c := mustCompile(t, g, tok)
		for n := int64(-1500); n <= 1500; n++ {
			want := (tc.lo == none || n >= tc.lo) && (tc.hi == none || n <= tc.hi)
			if got := acceptText(c, strconv.FormatInt(n, 10), true) == nil; got != want {
				t.Fatalf("%s: %d: got %v, want %v", tc.schema, n, got, want)
			}
		}
		for _, s := range []string{"007", "-0", "00", "+5", "1.0", "1e2", ""} {
			if acceptText(c, s, true) == nil {
				t.Errorf("%s: %q accepted", tc.schema, s)
			}
		}
	}
	if _, err := FromJSONSchema(`{"type":"integer","minimum":5,"maximum":4}`); err == nil {
		t.Error("empty range accepted")
	}
	g, err := FromJSONSchema(fmt.Sprintf(`{"type":"integer","minimum":%d}`, int64(1e16)))
	if err != nil {
		t.Fatal(err)
	}
	c := mustCompile(t, g, tok)
	if acceptText(c, "9999999999999999", true) == nil || acceptText(c, "10000000000000000", true) != nil || acceptText(c, "123456789012345678", true) != nil {
		t.Error("large bound misapplied")
	}
}
