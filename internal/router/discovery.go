package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"
)

// DNSScheme marks a worker URL whose host names a set of workers rather
// than one: dns+http://prefill-headless:8000 stands for http://IP:8000 for
// every A and AAAA record of prefill-headless, looked up again every
// ResolveInterval. A Kubernetes headless Service answers with the IPs of
// its ready pods, so scaling a Deployment needs no router restart.
const DNSScheme = "dns+http"

// defaultResolveInterval is how often a name that has workers is looked up
// again. It is a few seconds rather than the probe interval because a pod
// that joins is first useful after its own start-up, and a pod that leaves
// has already failed its /health probe by the time DNS drops it.
const defaultResolveInterval = 5 * time.Second

// Resolver looks up a host name's addresses; *net.Resolver implements it.
// Options.Resolver takes one so that tests can add and remove addresses
// between lookups.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// dnsSource is one dns+http URL: a name whose addresses are workers of one
// role.
type dnsSource struct {
	raw  string // as configured, for logs
	role string
	host string
	port string
	// urls are the workers of the last conclusive answer, sorted; a lookup
	// that fails for any reason but "no such name" keeps them, so that a
	// DNS hiccup does not empty a working deployment.
	urls    []string
	lastErr string // the last failure logged, to log each new one once
}

// discovery is the router's part that follows DNS names. Its fields are
// set by New and then only read, except where noted.
type discovery struct {
	sources  []*dnsSource
	resolver Resolver
	interval time.Duration
	// static are the workers given as plain URLs, per role; they are kept
	// whatever DNS says and come first in the lists, in configured order.
	staticPrefill, staticDecode []*worker

	mu   sync.Mutex // serialises lookups and guards last and the sources' fields
	last time.Time  // when every source was last looked up

	// draining are workers DNS no longer lists but whose streams have not
	// ended; they are closed when the last one does. Guarded by Router.mu.
	draining map[*worker]struct{}
}

// parseDNSSource reads a dns+http URL. ok is false when raw is not one, so
// that the caller treats it as a plain worker URL.
func parseDNSSource(raw, role string) (src *dnsSource, ok bool, err error) {
	s := strings.TrimRight(strings.TrimSpace(raw), "/")
	if !strings.HasPrefix(strings.ToLower(s), DNSScheme+":") {
		return nil, false, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, true, err
	}
	switch {
	case u.Hostname() == "":
		return nil, true, errors.New("no host")
	case u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "":
		// Worker URLs are base addresses; anything after the host would be
		// silently dropped from every expanded URL.
		return nil, true, errors.New("a dns+http URL is a host and a port only")
	}
	port := u.Port()
	if port == "" {
		port = "80"
	}
	return &dnsSource{raw: s, role: role, host: u.Hostname(), port: port}, true, nil
}

// lookup asks the resolver for the source's addresses and records the
// workers they name. It reports whether the set changed.
func (s *dnsSource) lookup(ctx context.Context, res Resolver, timeout time.Duration, r *Router) bool {
	lctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	addrs, err := res.LookupNetIP(lctx, "ip", s.host)
	if ctx.Err() != nil {
		// Cut short by shutdown: says nothing about the name.
		return false
	}
	var urls []string
	if err != nil {
		var de *net.DNSError
		if !errors.As(err, &de) || !de.IsNotFound {
			if msg := err.Error(); msg != s.lastErr {
				s.lastErr = msg
				r.log.Warn("worker discovery: lookup failed; keeping the workers found before",
					"source", s.raw, "role", s.role, "workers", len(s.urls), "err", err)
			}
			return false
		}
		// No such name is an answer: a headless Service with no ready pod
		// has no records.
	}
	for _, a := range addrs {
		a = a.Unmap().WithZone("")
		if !a.IsValid() {
			continue
		}
		urls = append(urls, "http://"+net.JoinHostPort(a.String(), s.port))
	}
	slices.Sort(urls)
	urls = slices.Compact(urls)
	if len(urls) == 0 {
		if msg := "no addresses"; msg != s.lastErr {
			s.lastErr = msg
			r.log.Warn("worker discovery: the name has no addresses", "source", s.raw, "role", s.role, "err", err)
		}
	} else {
		s.lastErr = ""
	}
	if slices.Equal(urls, s.urls) {
		return false
	}
	s.urls = urls
	return true
}

// discover looks up the dns+http sources when ResolveInterval has passed
// since the last round, and any source without workers every time, so
// that a router started before its workers serves as soon as they are
// ready. It then brings the worker lists in line with the answers.
func (r *Router) discover(ctx context.Context) {
	d := &r.disc
	if len(d.sources) == 0 {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	due := d.last.IsZero() || now.Sub(d.last) >= d.interval
	var todo []*dnsSource
	for _, s := range d.sources {
		if due || len(s.urls) == 0 {
			todo = append(todo, s)
		}
	}
	if len(todo) == 0 {
		return
	}
	if due {
		d.last = now
	}
	changed := make([]bool, len(todo))
	var wg sync.WaitGroup
	for i, s := range todo {
		wg.Go(func() { changed[i] = s.lookup(ctx, d.resolver, r.probeTimeout(), r) })
	}
	wg.Wait()
	if !slices.Contains(changed, true) {
		return
	}
	r.applyDiscovery()
}

// applyDiscovery rebuilds both worker lists from the static workers and
// the sources' last answers. A worker that is listed again keeps its
// connection and health; a new one starts unprobed (out of rotation until
// its first probe); one no longer listed leaves rotation at once and is
// closed when its last stream ends. Callers hold disc.mu.
func (r *Router) applyDiscovery() {
	var retire, added, gone []*worker
	r.mu.Lock()
	if r.closed.Load() {
		r.mu.Unlock()
		return
	}
	for _, l := range []struct {
		role   string
		static []*worker
		list   *[]*worker
	}{{rolePrefill, r.disc.staticPrefill, &r.prefill}, {roleDecode, r.disc.staticDecode, &r.decode}} {
		known := map[string]*worker{}
		for w := range r.disc.draining {
			if w.role == l.role {
				known[w.url] = w
			}
		}
		for _, w := range *l.list {
			known[w.url] = w
		}
		next := slices.Clone(l.static)
		listed := map[string]bool{}
		for _, w := range next {
			listed[w.url] = true
		}
		for _, s := range r.disc.sources {
			if s.role != l.role {
				continue
			}
			for _, u := range s.urls {
				if listed[u] {
					continue // also static, or also behind another name
				}
				listed[u] = true
				w := known[u]
				switch {
				case w == nil:
					w = newWorker(u, l.role, r.rm)
					added = append(added, w)
				case w.removed:
					// Back before its last stream ended: the same process,
					// most likely, so its connection is worth keeping.
					w.removed = false
					delete(r.disc.draining, w)
					added = append(added, w)
				}
				next = append(next, w)
			}
		}
		for _, w := range *l.list {
			if listed[w.url] {
				continue
			}
			w.removed = true
			gone = append(gone, w)
			for k := range r.mismatches {
				if k[0] == w || k[1] == w {
					delete(r.mismatches, k)
				}
			}
			if w.inflight == 0 {
				retire = append(retire, w)
			} else {
				r.disc.draining[w] = struct{}{}
			}
		}
		// A new slice, not an edit in place: Refresh and Close range over
		// copies taken under r.mu, and so may anyone else.
		*l.list = next
	}
	r.mu.Unlock()
	for _, w := range added {
		r.log.Info("worker discovered", "url", w.url, "role", w.role)
	}
	for _, w := range gone {
		r.log.Info("worker no longer in DNS; out of rotation, closed once its streams end", "url", w.url, "role", w.role)
	}
	for _, w := range retire {
		r.retire(w)
	}
}

// holdLocked counts an attempt against its two workers, so that a worker DNS
// drops meanwhile stays connected until the attempt is over.
func (r *Router) holdLocked(ws ...*worker) {
	for _, w := range ws {
		w.inflight++
	}
}

// release ends what hold began, and closes a dropped worker whose last
// attempt this was.
func (r *Router) release(ws ...*worker) {
	var retire []*worker
	r.mu.Lock()
	for _, w := range ws {
		w.inflight--
		if w.removed && w.inflight == 0 {
			if _, ok := r.disc.draining[w]; ok {
				delete(r.disc.draining, w)
				retire = append(retire, w)
			}
		}
	}
	r.mu.Unlock()
	for _, w := range retire {
		r.retire(w)
	}
}

// retire closes a worker that left the lists and forgets its metric
// series, so that a deployment whose pods come and go does not accumulate
// them; a worker of the same URL that joined since keeps its series.
func (r *Router) retire(w *worker) {
	r.mu.Lock()
	conn := w.conn
	w.conn, w.addr, w.healthy = nil, "", false
	relisted := false
	for _, o := range append(append([]*worker(nil), r.prefill...), r.decode...) {
		if o.url == w.url && o.role == w.role {
			relisted = true
		}
	}
	r.mu.Unlock()
	if conn != nil {
		_ = conn.Close()
	}
	if !relisted {
		r.rm.healthy.DeleteLabelValues(w.url, w.role)
		r.rm.picks.DeleteLabelValues(w.url, w.role)
	}
	r.log.Debug("worker closed", "url", w.url, "role", w.role)
}

// drainingLocked lists the dropped workers that still have streams, for
// Close.
func (r *Router) drainingLocked() []*worker {
	out := make([]*worker, 0, len(r.disc.draining))
	for w := range r.disc.draining {
		out = append(out, w)
	}
	return out
}

// init parses the dns+http URLs among the configured ones and returns the
// rest, which New treats as plain worker URLs.
func (d *discovery) init(o Options) (prefill, decode []string, err error) {
	d.resolver = o.Resolver
	if d.resolver == nil {
		d.resolver = net.DefaultResolver
	}
	d.interval = o.ResolveInterval
	if d.interval <= 0 {
		d.interval = defaultResolveInterval
	}
	d.draining = map[*worker]struct{}{}
	seen := map[string]bool{}
	for _, l := range []struct {
		role string
		urls []string
		rest *[]string
	}{{rolePrefill, o.Prefill, &prefill}, {roleDecode, o.Decode, &decode}} {
		for _, raw := range l.urls {
			src, ok, err := parseDNSSource(raw, l.role)
			if !ok {
				*l.rest = append(*l.rest, raw)
				continue
			}
			if err != nil {
				return nil, nil, fmt.Errorf("router: %s worker %q: %w", l.role, raw, err)
			}
			key := src.host + ":" + src.port
			if seen[key] {
				return nil, nil, fmt.Errorf("router: %s://%s is listed twice", DNSScheme, key)
			}
			seen[key] = true
			d.sources = append(d.sources, src)
		}
	}
	return prefill, decode, nil
}
