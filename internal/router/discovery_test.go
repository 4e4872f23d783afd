package router

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/batonlm/baton/internal/request"
)

// fakeResolver answers from a table the test edits between lookups.
type fakeResolver struct {
	mu      sync.Mutex
	answers map[string][]netip.Addr
	errs    map[string]error
	lookups map[string]int
}

func newFakeResolver() *fakeResolver {
	return &fakeResolver{answers: map[string][]netip.Addr{}, errs: map[string]error{}, lookups: map[string]int{}}
}

func (f *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lookups[host]++
	if network != "ip" {
		return nil, fmt.Errorf("network %q: want both A and AAAA (ip)", network)
	}
	if err := f.errs[host]; err != nil {
		return nil, err
	}
	if a, ok := f.answers[host]; ok && len(a) > 0 {
		return slices.Clone(a), nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (f *fakeResolver) set(host string, ips ...string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[host] = nil
	f.answers[host] = nil
	for _, ip := range ips {
		f.answers[host] = append(f.answers[host], netip.MustParseAddr(ip))
	}
}

func (f *fakeResolver) fail(host string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.errs[host] = err
}

func (f *fakeResolver) count(host string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lookups[host]
}

// dnsCluster is a router whose prefill workers are behind one DNS name:
// fakes on 127.0.0.2, 127.0.0.3, ... sharing one HTTP port, as pods behind
// a headless Service share their container port. Decode is one static URL.
type dnsCluster struct {
	*cluster
	res  *fakeResolver
	port int
	byIP map[string]*fake
}

const prefillName = "prefill-headless.test"

func newDNSCluster(t *testing.T, nPrefill int, opt func(*Options)) *dnsCluster {
	t.Helper()
	res := newFakeResolver()
	var ips []string
	for i := range nPrefill {
		ips = append(ips, "127.0.0."+strconv.Itoa(i+2))
	}
	port := freeSharedPort(t, ips)
	dc := &dnsCluster{res: res, port: port, byIP: map[string]*fake{}}
	dc.cluster = newCluster(t, 0, 1, func(o *Options) {
		o.Prefill = []string{fmt.Sprintf("dns+http://%s:%d", prefillName, port)}
		o.Resolver = res
		// Every Refresh looks the name up again unless a test says not.
		o.ResolveInterval = time.Nanosecond
		if opt != nil {
			opt(o)
		}
	})
	for _, ip := range ips {
		f := newFake(t, dc.net, rolePrefill)
		f.stopHTTP()
		f.startHTTP(net.JoinHostPort(ip, strconv.Itoa(port)))
		dc.byIP[ip] = f
		dc.prefill = append(dc.prefill, f)
	}
	return dc
}

// freeSharedPort finds a port free on every one of ips.
func freeSharedPort(t *testing.T, ips []string) int {
	t.Helper()
	for range 50 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Skipf("cannot listen on %s (this test needs all of 127.0.0.0/8 on loopback): %v", ips[0], err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		lns := []net.Listener{ln}
		ok := true
		for _, ip := range ips[1:] {
			l, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, l)
		}
		for _, l := range lns {
			_ = l.Close()
		}
		if ok {
			return port
		}
	}
	t.Fatal("no port free on every test address")
	return 0
}

func (dc *dnsCluster) url(ip string) string {
	return "http://" + net.JoinHostPort(ip, strconv.Itoa(dc.port))
}

// prefillURLs are the prefill workers the router lists, healthy or not.
func (dc *dnsCluster) prefillURLs() []string {
	var out []string
	for _, w := range dc.r.Workers() {
		if w.Role == rolePrefill {
			out = append(out, w.URL)
		}
	}
	return out
}

func (dc *dnsCluster) run(t *testing.T, id string) {
	t.Helper()
	st, err := dc.generate(id, 4, request.Params{})
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	if _, last := readAll(t, st); last.Finish != request.FinishLength || last.Err != nil {
		t.Fatalf("%s: last event %+v", id, last)
	}
}

func TestDNSDiscoveryFollowsTheName(t *testing.T) {
	dc := newDNSCluster(t, 3, nil)
	a, b, c := "127.0.0.2", "127.0.0.3", "127.0.0.4"

	// No record yet (no ready pod): nothing to route to.
	dc.refresh()
	if dc.r.Ready() || len(dc.prefillURLs()) != 0 {
		t.Fatalf("ready %v with workers %v before the name had addresses", dc.r.Ready(), dc.prefillURLs())
	}

	dc.res.set(prefillName, a)
	dc.refresh()
	if got := dc.prefillURLs(); !slices.Equal(got, []string{dc.url(a)}) {
		t.Fatalf("workers %v, want %s", got, dc.url(a))
	}
	if !dc.r.Ready() {
		t.Fatalf("not ready: %+v", dc.r.Workers())
	}
	dc.run(t, "one")

	// Scaled up: the new pods join without a restart and get requests.
	dc.res.set(prefillName, c, a, b)
	dc.refresh()
	if got, want := dc.prefillURLs(), []string{dc.url(a), dc.url(b), dc.url(c)}; !slices.Equal(got, want) {
		t.Fatalf("workers %v, want %v", got, want)
	}
	for i := range 6 {
		dc.run(t, fmt.Sprintf("three-%d", i))
	}
	for _, ip := range []string{a, b, c} {
		if dc.byIP[ip].count("Prefill") == 0 {
			t.Errorf("prefill at %s got no request after joining", ip)
		}
	}
	aBefore := dc.byIP[a].count("Info")

	// Scaled down: a is gone from DNS; it is neither listed nor picked.
	dc.res.set(prefillName, b, c)
	dc.refresh()
	if got, want := dc.prefillURLs(), []string{dc.url(b), dc.url(c)}; !slices.Equal(got, want) {
		t.Fatalf("workers %v, want %v", got, want)
	}
	before := dc.byIP[a].count("Prefill")
	for i := range 4 {
		dc.run(t, fmt.Sprintf("two-%d", i))
	}
	if n := dc.byIP[a].count("Prefill"); n != before {
		t.Errorf("a worker DNS dropped got %d more requests", n-before)
	}
	if n := dc.byIP[a].count("Info"); n != aBefore {
		t.Errorf("a worker DNS dropped was probed %d more times", n-aBefore)
	}

	// Back again (a pod restarted with the same IP): listed and used.
	dc.res.set(prefillName, a, b, c)
	dc.refresh()
	if len(dc.prefillURLs()) != 3 {
		t.Fatalf("workers %v after a came back", dc.prefillURLs())
	}
	before = dc.byIP[a].count("Prefill")
	for i := range 3 {
		dc.run(t, fmt.Sprintf("back-%d", i))
	}
	if dc.byIP[a].count("Prefill") == before {
		t.Error("a worker back in DNS got no requests")
	}

	// Every pod gone: the name has no records, so the router is not ready
	// and says why without touching a worker.
	dc.res.set(prefillName)
	dc.refresh()
	if dc.r.Ready() || len(dc.prefillURLs()) != 0 {
		t.Fatalf("ready %v with workers %v after the name lost its addresses", dc.r.Ready(), dc.prefillURLs())
	}
	if _, err := dc.generate("none", 4, request.Params{}); err == nil || !strings.Contains(err.Error(), "prefill") {
		t.Errorf("with no prefill worker: %v", err)
	}
	if !strings.Contains(dc.logs.String(), "worker discovered") || !strings.Contains(dc.logs.String(), "no longer in DNS") {
		t.Errorf("joins and departures are not logged:\n%s", dc.logs.String())
	}
}

func TestDNSDroppedWorkerFinishesItsStreams(t *testing.T) {
	dc := newDNSCluster(t, 2, nil)
	dc.res.set(prefillName, "127.0.0.2", "127.0.0.3")
	dc.refresh()
	dc.run(t, "warm-0")
	dc.run(t, "warm-1")
	done := leakCheck(t)
	holdAfterOne(dc.cluster)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	firstToken := func(id string) *stream {
		t.Helper()
		st, err := dc.generate(id, 4, request.Params{})
		if err != nil {
			t.Fatal(err)
		}
		if ev, ok := st.Next(ctx); !ok || ev.Token == nil {
			t.Fatalf("%s: no first token", id)
		}
		return st
	}
	before := map[string]int{}
	for ip, f := range dc.byIP {
		before[ip] = f.count("Prefill")
	}
	st := firstToken("long")
	var gone, stays string
	for ip, f := range dc.byIP {
		if f.count("Prefill") > before[ip] {
			gone = ip
		} else {
			stays = ip
		}
	}
	if gone == "" || stays == "" {
		t.Fatal("test setup: cannot tell which prefill worker took the request")
	}
	w := dc.workerFor(t, dc.url(gone))

	// The pod leaves the Service (it is terminating) while a stream that it
	// prefilled runs.
	dc.res.set(prefillName, stays)
	dc.refresh()
	if got := dc.prefillURLs(); !slices.Equal(got, []string{dc.url(stays)}) {
		t.Fatalf("workers %v", got)
	}
	dc.r.mu.Lock()
	connected, draining := w.conn != nil, len(dc.r.disc.draining)
	dc.r.mu.Unlock()
	if !connected || draining != 1 {
		t.Fatalf("a dropped worker with a stream in flight: connected %v, draining %d", connected, draining)
	}
	// New requests go to the other worker while the stream goes on.
	n := dc.byIP[stays].count("Prefill")
	other := firstToken("meanwhile")
	other.Stop()
	if dc.byIP[stays].count("Prefill") != n+1 || dc.byIP[gone].count("Prefill") != before[gone]+1 {
		t.Error("a new request went to the dropped worker")
	}

	// The stream ends normally; only then is the dropped worker closed.
	dc.r.mu.Lock()
	connected = w.conn != nil
	dc.r.mu.Unlock()
	if !connected {
		t.Fatal("the dropped worker was closed while its stream ran")
	}
	st.Stop()
	d := dc.decode[0]
	eventually(t, "Finish", func() bool { return d.count("Finish") == 2 })
	eventually(t, "the dropped worker to close", func() bool {
		dc.r.mu.Lock()
		defer dc.r.mu.Unlock()
		return w.conn == nil && len(dc.r.disc.draining) == 0
	})
	if n := d.count("Abort"); n != 0 {
		t.Errorf("%d streams aborted; they should have finished", n)
	}
	done()
}

// workerFor returns the router's worker for a URL.
func (dc *dnsCluster) workerFor(t *testing.T, u string) *worker {
	t.Helper()
	dc.r.mu.Lock()
	defer dc.r.mu.Unlock()
	for _, w := range append(append([]*worker(nil), dc.r.prefill...), dc.r.decode...) {
		if w.url == u {
			return w
		}
	}
	t.Fatalf("no worker %s", u)
	return nil
}

func TestDNSLookupFailureKeepsWorkers(t *testing.T) {
	dc := newDNSCluster(t, 2, nil)
	a := "127.0.0.2"
	dc.res.set(prefillName, a)
	dc.refresh()
	if !dc.r.Ready() {
		t.Fatal("not ready")
	}
	// A server failure is no answer: the workers stay.
	dc.res.fail(prefillName, &net.DNSError{Err: "server misbehaving", Name: prefillName, IsTemporary: true})
	dc.refresh()
	dc.refresh()
	if got := dc.prefillURLs(); !slices.Equal(got, []string{dc.url(a)}) || !dc.r.Ready() {
		t.Fatalf("after failed lookups: workers %v, ready %v", got, dc.r.Ready())
	}
	if n := strings.Count(dc.logs.String(), "lookup failed"); n != 1 {
		t.Errorf("the same failure was logged %d times, want once", n)
	}
	dc.run(t, "still")
	// So is an error that is not a DNS error at all.
	dc.res.fail(prefillName, errors.New("resolver broke"))
	dc.refresh()
	if !dc.r.Ready() {
		t.Fatal("an unrelated resolver error emptied the worker list")
	}
}

func TestDNSResolveInterval(t *testing.T) {
	dc := newDNSCluster(t, 2, func(o *Options) { o.ResolveInterval = time.Hour })
	a, b := "127.0.0.2", "127.0.0.3"
	// A name without workers is looked up at every refresh, so that the
	// router is ready as soon as the first pod is.
	dc.refresh()
	dc.refresh()
	if n := dc.res.count(prefillName); n != 2 {
		t.Fatalf("%d lookups of an empty name over 2 refreshes", n)
	}
	dc.res.set(prefillName, a)
	dc.refresh()
	if !dc.r.Ready() {
		t.Fatal("not ready")
	}
	// Then only every ResolveInterval: b is not seen within the hour.
	dc.res.set(prefillName, a, b)
	dc.refresh()
	dc.refresh()
	if n := dc.res.count(prefillName); n != 3 {
		t.Errorf("%d lookups, want 3 (the name had workers and the interval had not passed)", n)
	}
	if len(dc.prefillURLs()) != 1 {
		t.Errorf("workers %v", dc.prefillURLs())
	}
}

func TestDNSWithStaticWorkers(t *testing.T) {
	// A static URL that DNS also lists is one worker, kept first and kept
	// when DNS drops it.
	dc := newDNSCluster(t, 2, nil)
	a, b := "127.0.0.2", "127.0.0.3"
	r, err := New(Options{
		Prefill:         []string{dc.url(b), fmt.Sprintf("dns+http://%s:%d", prefillName, dc.port)},
		Decode:          []string{dc.decode[0].url()},
		Resolver:        dc.res,
		ResolveInterval: time.Nanosecond,
		HealthInterval:  time.Hour,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	urls := func() []string {
		var out []string
		for _, w := range r.Workers() {
			if w.Role == rolePrefill {
				out = append(out, w.URL)
			}
		}
		return out
	}
	dc.res.set(prefillName, a, b)
	r.Refresh(context.Background())
	if got, want := urls(), []string{dc.url(b), dc.url(a)}; !slices.Equal(got, want) {
		t.Fatalf("workers %v, want %v", got, want)
	}
	dc.res.set(prefillName)
	r.Refresh(context.Background())
	if got, want := urls(), []string{dc.url(b)}; !slices.Equal(got, want) || !r.Ready() {
		t.Fatalf("workers %v (want %v), ready %v", got, want, r.Ready())
	}
}

func TestParseDNSSource(t *testing.T) {
	for _, tc := range []struct {
		raw, host, port string
	}{
		{"dns+http://prefill-headless:8000", "prefill-headless", "8000"},
		{" DNS+HTTP://decode.ns.svc.cluster.local:8200/ ", "decode.ns.svc.cluster.local", "8200"},
		{"dns+http://prefill", "prefill", "80"},
		{"dns+http://[fd00::1]:9000", "fd00::1", "9000"},
	} {
		s, ok, err := parseDNSSource(tc.raw, rolePrefill)
		if !ok || err != nil || s.host != tc.host || s.port != tc.port {
			t.Errorf("parseDNSSource(%q) = %+v, %v, %v", tc.raw, s, ok, err)
		}
	}
	for _, raw := range []string{"dns+http://", "dns+http://h:1/v1", "dns+http://h:1?x=1", "dns+http://u@h:1"} {
		if _, ok, err := parseDNSSource(raw, rolePrefill); !ok || err == nil {
			t.Errorf("parseDNSSource(%q) accepted (ok %v)", raw, ok)
		}
	}
	if _, ok, _ := parseDNSSource("http://h:1", rolePrefill); ok {
		t.Error("a plain URL taken for a DNS source")
	}
	for _, o := range []Options{
		{Prefill: []string{"dns+http://p:1", "dns+http://p:1/"}, Decode: []string{"http://d:1"}},
		{Prefill: []string{"dns+http://p:1/x"}, Decode: []string{"http://d:1"}},
		{Prefill: []string{"dns+https://p:1"}, Decode: []string{"http://d:1"}},
	} {
		if r, err := New(o); err == nil {
			r.Close()
			t.Errorf("New(%v) accepted", o.Prefill)
		}
	}
	r, err := New(Options{Prefill: []string{"dns+http://p:1"}, Decode: []string{"dns+http://d:1"}})
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
}

// TestDNSExpandsIPv6 checks the URL form of an AAAA record.
func TestDNSExpandsIPv6(t *testing.T) {
	res := newFakeResolver()
	res.set("p", "fd00::7", "10.0.0.9", "::ffff:10.0.0.8")
	r, err := New(Options{Prefill: []string{"dns+http://p:8100"}, Decode: []string{"http://127.0.0.1:1"}, Resolver: res})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	// Only the lookup, no probe: these addresses are not to be dialled.
	s := r.disc.sources[0]
	if !s.lookup(context.Background(), res, time.Second, r) {
		t.Fatal("no change seen")
	}
	if got, want := s.urls, []string{"http://10.0.0.8:8100", "http://10.0.0.9:8100", "http://[fd00::7]:8100"}; !slices.Equal(got, want) {
		t.Errorf("urls %v, want %v", got, want)
	}
}
