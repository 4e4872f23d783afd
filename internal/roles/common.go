// Package roles wires the prefill and decode workers: the gRPC control plane
// of api/pd/v1 on top of a scheduler engine, a KV pool and a transport.
package roles

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	"github.com/batonlm/baton/api/openai"
	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/httpauth"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
)

// Layout describes the KV pages a worker holds, for pairing checks, with
// f32 KV (a worker storing another dtype sets Dtype).
func Layout(modelID string, c *model.Config, pageSize int) *pdv1.KVLayout {
	return &pdv1.KVLayout{Model: modelID, PageSize: uint32(pageSize), Dtype: "f32", Layers: uint32(c.Layers),
		KvHeads: uint32(c.KVHeads), HeadDim: uint32(c.HeadDim)}
}

// ModelID names a model for pairing: the served name and a digest of the
// shape, so two workers serving different weights under one name still
// refuse to pair when their shapes differ.
func ModelID(name string, c *model.Config) string {
	id := fmt.Sprintf("%s/%s-v%d-d%d-l%d-h%d-kv%d-hd%d-ff%d", name, c.Arch, c.Vocab, c.Dim, c.Layers, c.Heads, c.KVHeads, c.HeadDim, c.FF)
	if c.Experts > 0 {
		id += fmt.Sprintf("-e%dx%d", c.Experts, c.ExpertsUsed)
	}
	return id
}

// withRequestID tags an outgoing call with the request id, so the three
// processes' logs can be joined on it.
func withRequestID(ctx context.Context, id string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-request-id", id)
}

// callerID names the caller of an RPC for the per-peer bounds: its proven
// identity, else the host it calls from.
func callerID(ctx context.Context) string { return auth.Caller(ctx).ID() }

// conns keeps one gRPC connection per peer address; opts authenticate
// them (none: plaintext, for tests on loopback).
type conns struct {
	opts []grpc.DialOption
	mu   sync.Mutex
	m    map[string]*grpc.ClientConn
}

func (c *conns) get(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.m[addr]; ok {
		return cc, nil
	}
	opts := c.opts
	if opts == nil {
		opts = []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	if c.m == nil {
		c.m = map[string]*grpc.ClientConn{}
	}
	c.m[addr] = cc
	return cc, nil
}

func (c *conns) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.m {
		_ = cc.Close()
	}
	c.m = nil
}

// Worker is what the HTTP side and the shutdown of a worker need from its role.
type Worker interface {
	WorkerInfo() *pdv1.WorkerInfo
	SetShuttingDown()
	Busy() bool
}

// HTTPOptions are the access rules of a worker's HTTP side.
type HTTPOptions struct {
	// APIKey, when set, is required on every route but /health:
	// /server_info names the worker's internal addresses.
	APIKey string
	// MetricsRequireKey puts /metrics behind APIKey too; by default it
	// stays open for scrapers.
	MetricsRequireKey bool
	// Drain, when set, is what POST /drain starts (drainHandler says who
	// may ask).
	Drain func()
	// TransferPath says in /server_info which memory the KV pages pass
	// through on their way between the workers (kv_transfer_path).
	TransferPath string
}

// Readiness is what a worker's /health says: starting, ok, or draining.
// One lock holds both, so that a late "ready" (the server coming up) can
// never undo a drain that began first.
type Readiness struct {
	mu              sync.Mutex
	ready, draining bool
}

// SetReady says whether the worker may take work, unless it is draining.
func (r *Readiness) SetReady(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready = ok && !r.draining
}

// Drain says the worker takes no more work, for good.
func (r *Readiness) Drain() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ready, r.draining = false, true
}

// status is /health's word and whether it is a 200.
func (r *Readiness) status() (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.ready:
		return "ok", true
	case r.draining:
		return "draining", false
	}
	return "starting", false
}

// HTTPHandler serves a worker's /health, /metrics and /server_info.
func HTTPHandler(w Worker, ready *Readiness, ms *metrics.Set, o HTTPOptions) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(rw http.ResponseWriter, _ *http.Request) {
		st, ok := ready.status()
		if !ok {
			rw.WriteHeader(http.StatusServiceUnavailable)
		}
		_, _ = fmt.Fprintf(rw, `{"status":%q}`, st)
	})
	mux.Handle("GET /server_info", httpauth.Require(o.APIKey, http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		info := w.WorkerInfo()
		rw.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(rw).Encode(map[string]any{
			"role": info.Role, "grpc_addr": info.GrpcAddr, "transport": info.Transport, "transfer_addr": info.TransferAddr,
			"context_length": info.ContextLength, "effective_context_length": info.MaxSequenceTokens,
			"kv_pool_tokens": info.PoolTokens, "kv_pool_pages": info.PoolPages, "kv_pages_free": info.FreePages, "kv_pages_cached": info.CachedPages,
			"kv_pages_quarantined": info.QuarantinedPages, "running": info.Running, "queued": info.Queued,
			"model": info.Layout.GetModel(), "page_size": info.Layout.GetPageSize(), "kv_cache_dtype": info.Layout.GetDtype(),
			"internal_auth": info.InternalAuth, "kv_transfer_path": o.TransferPath,
		})
	})))
	var metricsH http.Handler = ms.Handler()
	if o.MetricsRequireKey {
		metricsH = httpauth.Require(o.APIKey, metricsH)
	}
	mux.Handle("GET /metrics", metricsH)
	if o.Drain != nil {
		mux.Handle("/drain", drainHandler(o))
	}
	// Unknown routes are keyed too, so that a caller without the key
	// cannot map what a worker serves.
	mux.Handle("/", httpauth.Require(o.APIKey, openai.NoRoute(mux)))
	return mux
}

// Identity is what a worker serves: the model name clients use and its
// tokenizer's fingerprint (tokenizer.Tokenizer.Fingerprint), and the files
// that tokenizer was read from, which prefill hands a router that has no
// model of its own (nil: it says it has none).
type Identity struct {
	ServedModel, Tokenizer string
	Files                  *pdv1.TokenizerFiles
}

// describeAuth says how peers are authenticated, for Info and /server_info.
func describeAuth(p *auth.Plane) string {
	if p == nil {
		return "none (loopback only)"
	}
	return p.Describe()
}

func poolInfo(info *pdv1.WorkerInfo, pool *kvpool.Pool) {
	st := pool.Stats()
	info.PoolTokens = uint32(pool.CapacityTokens())
	info.PoolPages = uint32(st.Total)
	info.FreePages = uint32(st.Free)
	info.CachedPages = uint32(st.Cached)
	info.QuarantinedPages = uint32(st.Quarantined)
}
