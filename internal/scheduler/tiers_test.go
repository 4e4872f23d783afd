package scheduler

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
)

// gatedStore is an in-memory L3 whose reads wait until open is closed.
type gatedStore struct {
	mu    sync.Mutex
	pages map[[2]uint64]gatedPage
	open  chan struct{}
}

type gatedPage struct {
	salt [16]byte
	data []byte
	sum  uint64
}

func (s *gatedStore) Put(k [2]uint64, salt [16]byte, page []byte, sum uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pages[k] = gatedPage{salt, append([]byte(nil), page...), sum}
	return nil
}

func (s *gatedStore) Get(k [2]uint64, salt [16]byte, dst []byte) (uint64, bool) {
	<-s.open
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pages[k]
	if !ok || p.salt != salt || len(dst) != len(p.data) || hicache.Checksum(p.data) != p.sum {
		return 0, false
	}
	copy(dst, p.data)
	return p.sum, true
}

func (s *gatedStore) Has(k [2]uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pages[k]
	return ok
}

func (s *gatedStore) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pages)
}

// newTieredEngine is newCachedEngine with lower tiers: L2 of l2Pages
// pages, and store as L3.
func newTieredEngine(t *testing.T, pageSize, pages, l2Pages int, store hicache.Store) (*Engine, *hicache.Tiers) {
	t.Helper()
	return newGuardedTieredEngine(t, pageSize, pages, l2Pages, store, Guards{})
}

func newGuardedTieredEngine(t *testing.T, pageSize, pages, l2Pages int, store hicache.Store, g Guards) (*Engine, *hicache.Tiers) {
	t.Helper()
	lm, pool := storiesPool(t, pageSize, pages)
	c := lm.Config
	ms := metrics.New("standalone")
	cache := prefixcache.New(pool, "stories260K", prefixcache.Guards{})
	tiers, err := hicache.New(hicache.Config{Pool: pool, Cache: cache, HostBytes: int64(l2Pages * pool.KV().PackedBytes(pageSize)),
		Policy: hicache.WriteBack, Store: store, Metrics: ms})
	if err != nil {
		t.Fatal(err)
	}
	e := NewEngine(lm, pool, Config{ContextLength: c.ContextLength, ChunkSize: 512, MaxRunning: 16, IsEOG: func(id int32) bool { return id == 2 },
		PrefixCache: cache, Tiers: tiers, Guards: g}, ms)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { e.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; tiers.Close() })
	return e, tiers
}

// An L1 that holds two prompts at a time, with prompts of four tenants
// going through: each tenant's prefix comes back from L2, the output is the
// reference's, and every page is accounted for.
func TestHiCacheL2HitsSameOutput(t *testing.T) {
	want := loadRef(t)
	const ps = 4
	n := len(want.PromptIDs)
	per := (n + len(want.GeneratedIDs) + ps - 1) / ps
	e, tiers := newTieredEngine(t, ps, per*2, 1024, nil)
	salt := func(i int) prefixcache.Salt {
		return prefixcache.TenantSalt(prefixcache.ScopeKey, string(rune('a'+i)), "")
	}
	p := Params{MaxTokens: len(want.GeneratedIDs), Sampling: model.Sampling{TopLogprobs: 5}}
	var base []model.Sampled
	for round := range 2 {
		for i := range 4 {
			p.Tenant = salt(i)
			toks, cached := run(t, e, want.PromptIDs, p)
			if base == nil {
				base = toks
				for j, tk := range toks {
					if tk.ID != want.GeneratedIDs[j] {
						t.Fatalf("token %d = %d, want %d", j, tk.ID, want.GeneratedIDs[j])
					}
				}
			}
			sameTokens(t, "tiered", toks, base)
			if round == 1 && cached != (n-1)/ps*ps {
				t.Fatalf("tenant %d read %d cached tokens in round 2, want %d", i, cached, (n-1)/ps*ps)
			}
		}
	}
	st := waitAccounted(t, e)
	if st.Evictions == 0 || st.ReadBeforeReady != 0 || st.Loading != 0 || st.Loaded == 0 {
		t.Fatalf("pool %+v", st)
	}
	if l2 := counter(e.m.HiCacheHits.WithLabelValues("l2")); l2 < float64(4*((n-1)/ps)) {
		t.Fatalf("%v pages found in L2, tiers %+v", l2, tiers.Stats())
	}
	if got := counter(e.m.KVReadBeforeReady); got != 0 {
		t.Fatalf("read before ready %v", got)
	}
}

// While a request's pages load, the scheduler does not step it; when they
// landed, it reads them, and the output is the reference's. With the wait
// taken away, the read gate refuses the loading pages and fails the
// request (read-before-ready, counted) instead of reading them.
func TestHiCacheWaitsForLoads(t *testing.T) {
	want := loadRef(t)
	const ps = 4
	n := len(want.PromptIDs)
	per := (n + len(want.GeneratedIDs) + ps - 1) / ps
	for _, wait := range []bool{true, false} {
		t.Run(map[bool]string{true: "wait", false: "no_wait"}[wait], func(t *testing.T) {
			store := &gatedStore{pages: map[[2]uint64]gatedPage{}, open: make(chan struct{})}
			var g Guards
			if !wait {
				g.LoadWait = func(*Engine, *Request) bool { return true }
			}
			e, _ := newGuardedTieredEngine(t, ps, per*2, 0, store, g) // no L2: evictions go straight to L3
			alice := prefixcache.TenantSalt(prefixcache.ScopeKey, "alice", "")
			p := Params{MaxTokens: len(want.GeneratedIDs), Tenant: alice}
			run(t, e, want.PromptIDs, p)
			evicted := e.Pool().EvictCached(-1)
			deadline := time.Now().Add(10 * time.Second)
			for store.len() < evicted {
				if time.Now().After(deadline) {
					t.Fatalf("L3 holds %d pages", store.len())
				}
				time.Sleep(time.Millisecond)
			}
			r := NewRequest("r", want.PromptIDs, p)
			if err := e.Enqueue(r); err != nil {
				t.Fatal(err)
			}
			if !wait {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				ev, ok := r.Next(ctx)
				if !ok || ev.Err == nil || !strings.Contains(ev.Err.Error(), "loading") {
					t.Fatalf("without the wait: %+v", ev)
				}
				if got := counter(e.m.KVReadBeforeReady); got != 1 {
					t.Fatalf("read before ready %v", got)
				}
				close(store.open)
				waitAccounted(t, e)
				return
			}
			for counter(e.m.HiCacheLoadWaits) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("the request never waited for its loads: pool %+v l3 hits %v state %s", e.Pool().Stats(), counter(e.m.HiCacheHits.WithLabelValues("l3")), r.State())
				}
				time.Sleep(time.Millisecond)
			}
			if st := e.Pool().Stats(); st.Loading == 0 || st.ReadBeforeReady != 0 {
				t.Fatalf("pool while loading %+v", st)
			}
			close(store.open)
			toks, _ := collect(t, r)
			for j, tk := range toks {
				if tk.ID != want.GeneratedIDs[j] {
					t.Fatalf("token %d = %d, want %d", j, tk.ID, want.GeneratedIDs[j])
				}
			}
			if got := counter(e.m.HiCacheHits.WithLabelValues("l3")); got != float64((n-1)/ps) {
				t.Fatalf("L3 hits %v", got)
			}
			if st := waitAccounted(t, e); st.ReadBeforeReady != 0 || st.Loaded == 0 {
				t.Fatalf("pool %+v", st)
			}
		})
	}
}
