// Package live runs the planner against a live fleet: it reads the
// workers' metrics every interval, asks internal/planner for the replica
// counts, exports them for an autoscaler (a Kubernetes HPA through
// prometheus-adapter, or KEDA) and logs each change with its reason.
package live

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/batonlm/baton/internal/planner"
	"github.com/batonlm/baton/internal/planner/scrape"
)

// Target is one worker to read.
type Target struct {
	URL  string
	Role string
}

// Options configure a Loop.
type Options struct {
	Planner *planner.Planner
	// Targets lists the workers now (the router's view, which follows
	// its DNS discovery).
	Targets func() []Target
	// Self, when set, is the router's own metrics (its queue and the
	// client's TTFT).
	Self     prometheus.Gatherer
	Client   *http.Client
	APIKey   string
	Interval time.Duration
	Logger   *slog.Logger
}

// Loop is the planning loop and its exported figures.
type Loop struct {
	opts    Options
	desired *prometheus.GaugeVec // role
	reason  *prometheus.GaugeVec // role, reason
	need    *prometheus.GaugeVec // role

	mu   sync.Mutex
	prev *scrape.Snapshot
	last planner.Decision
}

// New registers the loop's gauges on reg:
// baton_planner_desired_replicas{role} (what an HPA targets),
// baton_planner_needed_replicas{role} (before damping) and
// baton_planner_reason{role,reason}, 1 on the reason of the last decision.
func New(opts Options, reg prometheus.Registerer) *Loop {
	if opts.Client == nil {
		opts.Client = &http.Client{Timeout: 5 * time.Second}
	}
	if opts.Interval <= 0 {
		opts.Interval = 15 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Loop{opts: opts,
		desired: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "baton_planner_desired_replicas",
			Help: "Workers of the role the planner says the load needs, damped (hysteresis, cool-downs, scale-down window): an autoscaler's target."}, []string{"role"}),
		need: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "baton_planner_needed_replicas",
			Help: "Workers of the role the last window's load asked for, before damping."}, []string{"role"}),
		reason: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "baton_planner_reason",
			Help: "1 on the reason for the role's desired count at the last decision, 0 on the others."}, []string{"role", "reason"}),
	}
	reg.MustRegister(l.desired, l.need, l.reason)
	for _, role := range []string{planner.Prefill, planner.Decode} {
		for _, r := range planner.Reasons {
			l.reason.WithLabelValues(role, r)
		}
	}
	return l
}

// Run plans every interval until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	t := time.NewTicker(l.opts.Interval)
	defer t.Stop()
	l.Step(ctx, time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			l.Step(ctx, now)
		}
	}
}

// Step reads the fleet once and, from the second read on, decides and
// exports. It reports whether it decided.
func (l *Loop) Step(ctx context.Context, now time.Time) (planner.Decision, bool) {
	snap := l.read(ctx, now)
	l.mu.Lock()
	defer l.mu.Unlock()
	prev := l.prev
	l.prev = &snap
	if prev == nil {
		return planner.Decision{}, false
	}
	o := scrape.Observe(*prev, snap)
	d := l.opts.Planner.Decide(now, o)
	l.last = d
	for _, rd := range []planner.RoleDecision{d.Prefill, d.Decode} {
		l.desired.WithLabelValues(rd.Role).Set(float64(rd.Desired))
		l.need.WithLabelValues(rd.Role).Set(float64(rd.Need))
		for _, r := range planner.Reasons {
			v := 0.0
			if r == rd.Reason {
				v = 1
			}
			l.reason.WithLabelValues(rd.Role, r).Set(v)
		}
		level := slog.LevelDebug
		if rd.Changed() {
			level = slog.LevelInfo
		}
		l.opts.Logger.Log(ctx, level, "planner", "role", rd.Role, "from", rd.Current, "to", rd.Desired, "need", rd.Need,
			"reason", rd.Reason, "why", rd.Why, "ready", map[string]int{planner.Prefill: o.Prefill, planner.Decode: o.Decode}[rd.Role])
	}
	return d, true
}

// Last is the last decision (zero before the second read).
func (l *Loop) Last() planner.Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// read scrapes every target at once; a worker that does not answer is left
// out (it is not serving, so not capacity).
func (l *Loop) read(ctx context.Context, now time.Time) scrape.Snapshot {
	snap := scrape.Snapshot{At: now, Workers: map[string]scrape.Sample{}}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, t := range l.opts.Targets() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := scrape.Fetch(ctx, l.opts.Client, t.URL, l.opts.APIKey)
			if err != nil {
				l.opts.Logger.Debug("planner: scrape failed", "url", t.URL, "err", err)
				return
			}
			if t.Role != "" {
				s.Role = t.Role
			}
			mu.Lock()
			snap.Workers[t.URL] = s
			mu.Unlock()
		}()
	}
	wg.Wait()
	if l.opts.Self != nil {
		if mfs, err := l.opts.Self.Gather(); err == nil {
			s := scrape.Gathered(mfs)
			snap.Router = &s
		}
	}
	return snap
}
