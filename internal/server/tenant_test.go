package server

import (
	"net/http"
	"sync"
	"testing"

	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/scheduler"
)

// tenantGen is fakeGen that keeps the tenant each generation was asked
// under.
type tenantGen struct {
	*fakeGen
	mu      sync.Mutex
	tenants []prefixcache.Salt
}

func (g *tenantGen) Generate(id string, prompt []int32, p scheduler.Params) (Stream, error) {
	g.mu.Lock()
	g.tenants = append(g.tenants, p.Tenant)
	g.mu.Unlock()
	return g.fakeGen.Generate(id, prompt, p)
}

// last is the tenant of the latest generation.
func (g *tenantGen) last(t *testing.T) prefixcache.Salt {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.tenants) == 0 {
		t.Fatal("no generation was asked")
	}
	return g.tenants[len(g.tenants)-1]
}

// A request's tenant (the salt of everything cached across requests: its
// prefix cache pages, its compiled grammars) is its API key: behind a
// gateway that passes each caller's own bearer token, two keys are two
// tenants whose cached pages never meet, the same key is the same tenant
// every time, no key is a tenant of its own, and cache_salt splits a key
// further (where the route takes one). Every route that generates asks
// under it.
func TestTenantIsTheAPIKey(t *testing.T) {
	g := &tenantGen{fakeGen: &fakeGen{tokens: 1}}
	ts, _ := newTestServer(t, Options{Generator: g})
	routes := []struct{ path, body, salted string }{
		{"/v1/chat/completions", chatBody, `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":2,"cache_salt":"s"}`},
		{"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`, `{"model":"m","prompt":"hi","max_tokens":2,"cache_salt":"s"}`},
		// The Responses API has no cache_salt: its tenant is the key alone.
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":2}`, ""},
	}
	for _, rt := range routes {
		tenant := func(auth, body string) prefixcache.Salt {
			t.Helper()
			if code, _, b := do(t, http.MethodPost, ts.URL+rt.path, auth, body); code != http.StatusOK {
				t.Fatalf("%s with %q: %d %s", rt.path, auth, code, b)
			}
			return g.last(t)
		}
		alice, bob := tenant("Bearer key-alice", rt.body), tenant("Bearer key-bob", rt.body)
		if alice == bob {
			t.Fatalf("%s: two API keys were asked under one tenant %x", rt.path, alice)
		}
		if again := tenant("Bearer key-alice", rt.body); again != alice {
			t.Fatalf("%s: one API key was asked under tenants %x and %x", rt.path, alice, again)
		}
		if want := prefixcache.TenantSalt(prefixcache.ScopeKey, "key-alice", ""); alice != want {
			t.Fatalf("%s: the tenant of key-alice is %x, want TenantSalt's %x", rt.path, alice, want)
		}
		if none := tenant("", rt.body); none == alice || none == bob {
			t.Fatalf("%s: a request without a key shares a keyed tenant", rt.path)
		}
		if rt.salted == "" {
			continue
		}
		if salted := tenant("Bearer key-alice", rt.salted); salted == alice {
			t.Fatalf("%s: cache_salt did not split the key's tenant", rt.path)
		}
	}

	// --prefix-cache-scope global: one tenant across keys; cache_salt
	// still splits it.
	g = &tenantGen{fakeGen: &fakeGen{tokens: 1}}
	ts, _ = newTestServer(t, Options{Generator: g, PrefixCacheScope: prefixcache.ScopeGlobal})
	tenant := func(auth, body string) prefixcache.Salt {
		t.Helper()
		if code, _, b := do(t, http.MethodPost, ts.URL+"/v1/chat/completions", auth, body); code != http.StatusOK {
			t.Fatalf("global scope with %q: %d %s", auth, code, b)
		}
		return g.last(t)
	}
	if a, b := tenant("Bearer key-alice", chatBody), tenant("Bearer key-bob", chatBody); a != b {
		t.Fatal("global scope still splits tenants by API key")
	}
}
