package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/request"
)

// prefillsLocally makes the fake decode workers answer Generate, as a
// decode worker that computes short prompts itself says in its Info.
func prefillsLocally(fs []*fake) {
	for _, f := range fs {
		f.setInfo(func(i *pdv1.WorkerInfo) { i.PrefillsLocally = true })
	}
}

// A prompt short enough goes to the decode worker alone (Generate): no
// reservation, no prefill worker; a longer one is handed over; a decode
// worker that does not say it prefills locally, or a threshold of never,
// hands every prompt over.
func TestShortPromptsSkipTheHandoff(t *testing.T) {
	for _, tc := range []struct {
		name      string
		threshold int
		local     bool // the decode workers say they prefill locally
		prompt    int
		generates bool
	}{
		{"short", 8, true, 8, true},
		{"long", 8, true, 9, false},
		{"default threshold", 0, true, 200, true},
		{"decode cannot", 8, false, 4, false},
		{"never", -1, true, 4, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, 1, 1, func(o *Options) { o.DisaggPrefillThreshold = tc.threshold })
			if tc.local {
				prefillsLocally(c.decode)
			}
			c.refresh()
			st, err := c.generate("r", tc.prompt, request.Params{MaxTokens: 3})
			if err != nil {
				t.Fatal(err)
			}
			toks, last := readAll(t, st)
			if fmt.Sprint(toks) != "[100 101 102]" || last.Finish != request.FinishLength {
				t.Fatalf("tokens %v, last %+v", toks, last)
			}
			d, p := c.decode[0], c.prefill[0]
			gens, reserves := d.count("Generate"), d.count("Reserve")
			if tc.generates && (gens != 1 || reserves != 0 || p.count("Prefill") != 0) {
				t.Fatalf("short prompt: %d Generate, %d Reserve, %d Prefill; want it computed on decode alone", gens, reserves, p.count("Prefill"))
			}
			if !tc.generates && (gens != 0 || reserves != 1 || p.count("Prefill") != 1) {
				t.Fatalf("%d Generate, %d Reserve, %d Prefill; want a handoff", gens, reserves, p.count("Prefill"))
			}
			if got, want := value(c.r.rm.localPrefills), map[bool]float64{true: 1, false: 0}[tc.generates]; got != want {
				t.Fatalf("baton_router_local_prefill_total %v, want %v", got, want)
			}
			if tc.generates {
				d.mu.Lock()
				g := d.gens[0]
				d.mu.Unlock()
				if len(g.Prompt) != tc.prompt || g.Sampling.GetMaxTokens() != 3 || g.RequestId != "r" {
					t.Fatalf("Generate got %v", g)
				}
			}
		})
	}
}

// Under cache_aware, a decode worker thought to hold most of a long prompt
// computes it itself: the first time it is handed over, the second (the
// same prompt, now in the worker's record) is not.
func TestCachedPromptsSkipTheHandoff(t *testing.T) {
	c := newCluster(t, 1, 1, func(o *Options) { o.Policy = PolicyCacheAware; o.DisaggPrefillThreshold = 8 })
	prefillsLocally(c.decode)
	c.refresh()
	for range 2 {
		st, err := c.generate("r", 64, request.Params{MaxTokens: 3})
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, st)
	}
	if r, g := c.decode[0].count("Reserve"), c.decode[0].count("Generate"); r != 1 || g != 1 {
		t.Fatalf("%d Reserve, %d Generate; want the first handed over and the second computed on decode", r, g)
	}
}

// What one tenant sent a decode worker does not make another tenant's
// same prompt computed there: the record is kept per tenant, so the
// path a request takes (and its time) tells nothing of another tenant's
// prompts.
func TestCachedPromptsPerTenant(t *testing.T) {
	c := newCluster(t, 1, 1, func(o *Options) { o.Policy = PolicyCacheAware; o.DisaggPrefillThreshold = 8 })
	prefillsLocally(c.decode)
	c.refresh()
	alice := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", "")
	bob := prefixcache.TenantSalt(prefixcache.ScopeKey, "bob", "")
	for _, tenant := range []request.Salt{alice, alice, bob} {
		st, err := c.generate("r", 64, request.Params{MaxTokens: 3, Tenant: tenant})
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, st)
	}
	if r, g := c.decode[0].count("Reserve"), c.decode[0].count("Generate"); r != 2 || g != 1 {
		t.Fatalf("%d Reserve, %d Generate; want alice's second request computed on decode and bob's first handed over", r, g)
	}
}

// A decode worker computing a prompt itself that dies after the first
// tokens: the request goes on elsewhere from the tokens the client has,
// with none repeated; a client that leaves ends the call, so the worker
// ends the request; a refusal before any token is the client's answer.
func TestLocalPrefillFailoverAndCancel(t *testing.T) {
	c := newCluster(t, 1, 2, nil)
	prefillsLocally(c.decode)
	c.refresh()
	die := func(req *pdv1.GenerateRequest, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		for i := range 2 {
			if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: int32(100 + i)}}); err != nil {
				return err
			}
		}
		return fmt.Errorf("worker died")
	}
	goOn := func(req *pdv1.GenerateRequest, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		// It goes on from the prompt it was given: the first request's
		// 5 tokens and the 2 the client has.
		for i, n := len(req.Prompt)-5, int(req.Sampling.GetMaxTokens()); i < len(req.Prompt)-5+n; i++ {
			ev := &pdv1.TokenEvent{Token: &pdv1.Token{Id: int32(100 + i)}}
			if i == len(req.Prompt)-5+n-1 {
				ev.Finish = request.FinishLength
			}
			if err := srv.Send(ev); err != nil {
				return err
			}
		}
		return nil
	}
	c.decode[0].generateFn, c.decode[1].generateFn = die, goOn
	st, err := c.generate("m", 5, request.Params{MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	toks, last := readAll(t, st)
	if fmt.Sprint(toks) != "[100 101 102 103 104]" || last.Finish != request.FinishLength {
		t.Fatalf("tokens %v, last %+v; want one stream with no token repeated or missing", toks, last)
	}
	if got := value(c.r.rm.migrations.WithLabelValues(migrateDecodeError)) + value(c.r.rm.migrations.WithLabelValues(migrateDecodeGone)); got != 1 {
		t.Fatalf("%v migrations, want 1", got)
	}

	gone := make(chan struct{})
	c.decode[0].generateFn = func(req *pdv1.GenerateRequest, srv grpc.ServerStreamingServer[pdv1.TokenEvent]) error {
		if err := srv.Send(&pdv1.TokenEvent{Token: &pdv1.Token{Id: 100}}); err != nil {
			return err
		}
		<-srv.Context().Done()
		close(gone)
		return nil
	}
	c.decode[1].generateFn = c.decode[0].generateFn
	st, err = c.generate("c", 5, request.Params{MaxTokens: 50})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ev, ok := st.Next(ctx); !ok || ev.Token == nil {
		t.Fatalf("no first token: %+v", ev)
	}
	st.Cancel()
	select {
	case <-gone:
	case <-time.After(5 * time.Second):
		t.Fatal("the decode worker's call did not end when the client left")
	}
}
