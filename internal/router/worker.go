package router

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	pdv1 "github.com/batonlm/baton/api/pd/v1"
	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/tracing"
)

const (
	rolePrefill = "prefill"
	roleDecode  = "decode"
)

// worker is one configured prefill or decode worker. Everything below url
// and role is guarded by Router.mu.
type worker struct {
	url  string
	role string
	rm   *routerMetrics

	probed   bool // at least one probe finished (to log the first verdict)
	healthy  bool
	why      string // why it is unhealthy
	addr     string // the gRPC address conn dials
	conn     *grpc.ClientConn
	info     *pdv1.WorkerInfo
	assigned int // requests sent since info was fetched
	// assignedPages estimates the pages reserved since info was fetched.
	assignedPages int
	// inflight counts the attempts that picked this worker and have not
	// ended; removed is set when DNS stopped listing it (see discovery).
	inflight int
	removed  bool
	// tree is what the cache_aware policy thinks a worker caches.
	tree *approxTree
	// identity is why the worker's last Info was refused for its served
	// model or tokenizer; "" when it was not.
	identity string
	seen     *pdv1.WorkerInfo // the last Info answered, refused or not
}

func newWorker(u, role string, rm *routerMetrics) *worker {
	w := &worker{url: u, role: role, rm: rm}
	rm.healthy.WithLabelValues(u, role).Set(0)
	rm.picks.WithLabelValues(u, role) // at 0 from the start, as rate() wants
	return w
}

func (w *worker) prefillLoad() int {
	return int(w.info.GetRunning()) + int(w.info.GetQueued()) + w.assigned
}

// decodeFree counts cached pages as room: a reservation evicts them.
func (w *worker) decodeFree() int {
	return int(w.info.GetFreePages()) + int(w.info.GetCachedPages()) - w.assignedPages
}

func (w *worker) decodeRunning() int { return int(w.info.GetRunning()) + w.assigned }

func (w *worker) statusLocked() WorkerStatus {
	s := WorkerStatus{URL: w.url, Role: w.role, Healthy: w.healthy, GRPCAddr: w.addr}
	if !w.healthy {
		s.Error = w.why
	}
	if w.info != nil {
		s.MaxSequenceTokens = int(w.info.MaxSequenceTokens)
		s.FreePages = int(w.info.FreePages)
		s.Running = int(w.info.Running)
		s.Queued = int(w.info.Queued)
		s.InternalAuth = w.info.InternalAuth
	}
	if w.seen != nil {
		s.ServedModel, s.TokenizerFingerprint = w.seen.ServedModel, w.seen.TokenizerFingerprint
	}
	return s
}

func (w *worker) close(mu *sync.Mutex) {
	mu.Lock()
	conn := w.conn
	w.conn, w.addr, w.healthy = nil, "", false
	mu.Unlock()
	w.rm.healthy.WithLabelValues(w.url, w.role).Set(0)
	if conn != nil {
		_ = conn.Close()
	}
}

// probeTimeout bounds one probe of one worker, so that a hung worker is
// marked unhealthy instead of stalling the loop.
func (r *Router) probeTimeout() time.Duration {
	return min(max(2*r.o.HealthInterval, time.Second), 5*time.Second)
}

// Refresh looks up dns+http names when due, then probes every worker
// once, concurrently, and updates their health and load. Start calls it
// every HealthInterval; tests call it directly.
func (r *Router) Refresh(ctx context.Context) {
	if r.closed.Load() {
		return
	}
	r.discover(ctx)
	r.mu.Lock()
	ws := append(append([]*worker(nil), r.prefill...), r.decode...)
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() { r.probe(ctx, w) })
	}
	wg.Wait()
	r.mu.Lock()
	r.checkPairsLocked()
	r.mu.Unlock()
	// A probe may have found a worker back, or new, or with room.
	r.queue.kick()
}

// serverInfo is the part of a worker's /server_info the router reads.
type serverInfo struct {
	Role     string `json:"role"`
	GRPCAddr string `json:"grpc_addr"`
}

func (r *Router) probe(parent context.Context, w *worker) {
	ctx, cancel := context.WithTimeout(parent, r.probeTimeout())
	defer cancel()
	unhealthy := func(err error) {
		// A probe cut short by shutdown says nothing about the worker.
		if parent.Err() == nil {
			r.markUnhealthy(w, err)
		}
	}
	if err := r.getHealth(ctx, w.url); err != nil {
		unhealthy(err)
		return
	}
	// /server_info is read on every probe, not only when the worker comes
	// back: a worker restarted between two probes may listen for gRPC on a
	// new port, and the old connection would point at nothing.
	var si serverInfo
	if err := r.getJSON(ctx, w.url+"/server_info", &si); err != nil {
		unhealthy(fmt.Errorf("server_info: %w", err))
		return
	}
	if si.Role != "" && si.Role != w.role {
		unhealthy(fmt.Errorf("configured as a %s worker but /server_info says its role is %q", w.role, si.Role))
		return
	}
	if si.GRPCAddr == "" {
		unhealthy(errors.New("server_info has no grpc_addr"))
		return
	}
	addr, err := dialAddr(si.GRPCAddr, w.url)
	if err != nil {
		unhealthy(fmt.Errorf("server_info grpc_addr %q: %w", si.GRPCAddr, err))
		return
	}
	conn, err := r.connFor(w, addr)
	if err != nil {
		unhealthy(err)
		return
	}
	var info *pdv1.WorkerInfo
	if w.role == rolePrefill {
		info, err = pdv1.NewPrefillClient(conn).Info(ctx, &pdv1.InfoRequest{})
	} else {
		info, err = pdv1.NewDecodeClient(conn).Info(ctx, &pdv1.InfoRequest{})
	}
	if err != nil {
		unhealthy(fmt.Errorf("gRPC Info at %s: %w", addr, err))
		return
	}
	if info.Role != "" && info.Role != w.role {
		unhealthy(fmt.Errorf("configured as a %s worker but Info says its role is %q", w.role, info.Role))
		return
	}
	r.mu.Lock()
	w.seen = info
	w.identity = r.identityDiff(info)
	why := w.identity
	r.mu.Unlock()
	if why != "" {
		unhealthy(errors.New(why))
		return
	}
	r.mu.Lock()
	if w.conn != conn { // replaced by a concurrent probe or Close
		r.mu.Unlock()
		return
	}
	changed := !w.healthy || !w.probed
	w.info, w.assigned, w.assignedPages = info, 0, 0
	w.healthy, w.why, w.probed = true, "", true
	r.mu.Unlock()
	w.rm.healthy.WithLabelValues(w.url, w.role).Set(1)
	if changed {
		r.log.Info("worker healthy", "url", w.url, "role", w.role, "grpc_addr", addr,
			"max_sequence_tokens", info.MaxSequenceTokens, "pool_pages", info.PoolPages, "page_size", info.GetLayout().GetPageSize())
	}
}

// connFor returns the connection to addr, replacing one to another address.
func (r *Router) connFor(w *worker, addr string) (*grpc.ClientConn, error) {
	r.mu.Lock()
	if w.conn != nil && w.addr == addr {
		c := w.conn
		r.mu.Unlock()
		return c, nil
	}
	r.mu.Unlock()
	creds := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	if r.o.Auth != nil {
		creds = r.o.Auth.DialOptions(auth.Role(w.role))
	}
	creds = append(creds, tracing.DialOptions()...)
	conn, err := grpc.NewClient(addr, append(creds,
		// A restarted worker on the same address must be reachable at the
		// next probe, not after gRPC's default backoff of up to two minutes.
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second},
			MinConnectTimeout: 2 * time.Second,
		}))...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		_ = conn.Close()
		return nil, errors.New("router closed")
	}
	old, oldAddr := w.conn, w.addr
	w.conn, w.addr = conn, addr
	r.mu.Unlock()
	if old != nil {
		// The old address belongs to a process that is gone or replaced;
		// requests still on it fail and, before their first token, retry.
		_ = old.Close()
		r.log.Info("worker gRPC address changed", "url", w.url, "role", w.role, "old", oldAddr, "new", addr)
	}
	return conn, nil
}

// markUnhealthy takes a worker out of rotation until a probe succeeds
// again. Its connection stays open: a worker that answers /health with 503
// while it drains still finishes the streams it holds.
func (r *Router) markUnhealthy(w *worker, err error) {
	r.mu.Lock()
	was := w.healthy || !w.probed
	w.healthy, w.why, w.probed = false, err.Error(), true
	r.mu.Unlock()
	w.rm.healthy.WithLabelValues(w.url, w.role).Set(0)
	if was {
		r.log.Warn("worker unhealthy", "url", w.url, "role", w.role, "err", err)
	}
}

func (r *Router) getHealth(ctx context.Context, base string) error {
	resp, err := r.get(ctx, base+"/health")
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("health: HTTP %d", resp.StatusCode)
	}
	return nil
}

func (r *Router) getJSON(ctx context.Context, u string, v any) error {
	resp, err := r.get(ctx, u)
	if err != nil {
		return err
	}
	defer drain(resp)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(v)
}

func (r *Router) get(ctx context.Context, u string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	if r.o.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+r.o.APIKey)
	}
	return r.http.Do(req)
}

// drain reads what is left of a body so that its connection is reused by
// the next probe instead of a new one every second.
func drain(resp *http.Response) {
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	_ = resp.Body.Close()
}

// dialAddr makes a worker's advertised gRPC address dialable: a worker
// listening on every interface advertises 0.0.0.0 or [::], which names no
// host, so the host of its HTTP URL is used instead.
func dialAddr(advertised, base string) (string, error) {
	host, port, err := net.SplitHostPort(advertised)
	if err != nil {
		return "", err
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		u, err := url.Parse(base)
		if err != nil {
			return "", err
		}
		host = u.Hostname()
	}
	return net.JoinHostPort(host, port), nil
}

// FetchTokenizer asks the prefill workers, in turn, for the files of their
// tokenizer (a router started without --model learns the model this way);
// call it after Start or Refresh. Only a worker whose gRPC connection is
// up is asked; the first answer wins.
func (r *Router) FetchTokenizer(ctx context.Context) (*pdv1.TokenizerFiles, error) {
	r.mu.Lock()
	var conns []*grpc.ClientConn
	var urls []string
	for _, w := range r.prefill {
		if w.conn != nil && w.seen != nil {
			conns, urls = append(conns, w.conn), append(urls, w.url)
		}
	}
	r.mu.Unlock()
	if len(conns) == 0 {
		return nil, errors.New("no prefill worker answered")
	}
	var errs []error
	for i, c := range conns {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		tf, err := pdv1.NewPrefillClient(c).Tokenizer(cctx, &pdv1.TokenizerRequest{}, grpc.MaxCallRecvMsgSize(1<<30))
		cancel()
		if err == nil {
			r.log.Info("learned the tokenizer from a prefill worker", "url", urls[i], "served_model", tf.ServedModel,
				"tokenizer_fingerprint", tf.TokenizerFingerprint, "format", tf.Format)
			return tf, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", urls[i], err))
	}
	return nil, errors.Join(errs...)
}

// identityDiff says how a worker's served model or tokenizer differs from
// the router's, or "": the router tokenizes every prompt and names the
// model in every answer, so a worker that tokenizes differently would
// compute text nobody asked for under a name it does not serve.
func (r *Router) identityDiff(info *pdv1.WorkerInfo) string {
	switch {
	case r.o.ModelName != "" && info.ServedModel != "" && info.ServedModel != r.o.ModelName:
		return fmt.Sprintf("serves model %q, the router serves %q (give both the same --model or --served-model-name)", info.ServedModel, r.o.ModelName)
	case r.o.TokenizerFingerprint != "" && info.TokenizerFingerprint != "" && info.TokenizerFingerprint != r.o.TokenizerFingerprint:
		return fmt.Sprintf("tokenizes with another tokenizer (fingerprint %s, the router's %s): give the router the workers' --model or --tokenizer",
			info.TokenizerFingerprint, r.o.TokenizerFingerprint)
	}
	return ""
}

// name is the worker's URL for the log, or what stood in for it where an
// attempt had none (a prompt its decode worker computed itself).
func (w *worker) name() string {
	if w == nil {
		return "none: computed on decode"
	}
	return w.url
}
