package grammar

import (
	"encoding/json"
	"math/rand/v2"
	"testing"
)

func TestSmoke(t *testing.T) {
	g, err := FromJSONSchema(`{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"tags":{"type":"array","items":{"type":"string"}},"kind":{"enum":["a","b",3]}},"required":["name","age"]}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(g)
	for _, vn := range []string{"stories260K", "llama-spm", "gpt-2"} {
		c := Compile(g, loadTok(t, vn))
		rng := rand.New(rand.NewPCG(1, 2))
		for range 5 {
			ids, done := sample(t, c, rng, 3000)
			s := c.v.text(ids)
			t.Logf("%s %v %q", vn, done, s)
			if done && !json.Valid([]byte(s)) {
				t.Errorf("invalid %q", s)
			}
		}
		t.Log(len(c.ctxs))
	}
}
