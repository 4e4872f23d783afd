package fleetsim

import (
	"container/heap"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/batonlm/baton/internal/planner"
)

// Config is the fleet and how it is run.
type Config struct {
	Capacity planner.Capacity
	SLO      planner.SLO
	// PageSize is decode's KV page in tokens: a reservation holds
	// ceil((prompt+output)/PageSize) pages.
	PageSize int
	// Prefill and Decode are the workers at the start (and throughout,
	// with no Planner).
	Prefill, Decode int
	// Planner, when set, resizes the fleet every Interval; a worker it
	// adds serves after StartupDelay (and is paid for from when it was
	// asked for), one it removes takes no new work and leaves once empty.
	Planner      *planner.Config
	Interval     time.Duration
	StartupDelay time.Duration
}

// Result is one run's outcome.
type Result struct {
	Requests int
	// Met counts requests whose TTFT and mean inter-token latency were
	// both within their SLOs.
	Met, TTFTMet, ITLMet int
	// WorkerHours are the hours paid for, each worker from when it was
	// asked for to when it left (or the run ended).
	WorkerHours, PrefillHours, DecodeHours float64
	// TTFT and per-request mean ITL percentiles, seconds.
	TTFTP50, TTFTP99, ITLP50, ITLP99 float64
	MaxPrefill, MaxDecode            int
	// Changes are the planner's decisions that moved a count.
	Changes []planner.RoleDecision
	// End is when the last request finished.
	End time.Duration
}

// Attainment is the share of requests that met both SLOs.
func (r Result) Attainment() float64 {
	if r.Requests == 0 {
		return 1
	}
	return float64(r.Met) / float64(r.Requests)
}

// latencyBuckets are the workers' histogram bounds (internal/metrics), so
// that the planner reads the simulated fleet as it reads a real one.
var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, math.Inf(1)}

type req struct {
	Request
	kvTokens   int
	decode     *decodeW
	firstToken time.Duration
	lastToken  time.Duration
	generated  int
	itlSum     time.Duration
	done       bool
}

type worker struct {
	role     string
	added    time.Duration // when asked for: paid from here
	readyAt  time.Duration
	left     time.Duration // when it left; 0 while in the fleet
	draining bool
}

func (w *worker) ready(now time.Duration) bool { return !w.draining && w.left == 0 && now >= w.readyAt }

type prefillW struct {
	worker
	queue []*req
	busy  bool
	work  int // prompt tokens queued or in service
}

type decodeW struct {
	worker
	kvFree   int
	batch    []*req
	joining  []*req
	held     int // requests holding a reservation
	stepping bool
}

// event is one thing that happens at a time; seq breaks ties in the order
// events were made, so a run is the same every time.
type event struct {
	at  time.Duration
	seq uint64
	do  func()
}

type events []*event

func (e events) Len() int { return len(e) }
func (e events) Less(i, j int) bool {
	return e[i].at < e[j].at || (e[i].at == e[j].at && e[i].seq < e[j].seq)
}
func (e events) Swap(i, j int) { e[i], e[j] = e[j], e[i] }
func (e *events) Push(x any)   { *e = append(*e, x.(*event)) }
func (e *events) Pop() (x any) { old := *e; x, *e = old[len(old)-1], old[:len(old)-1]; return x }

type sim struct {
	cfg     Config
	now     time.Duration
	q       events
	seq     uint64
	prefill []*prefillW
	decode  []*decodeW
	waiting []*req // at the router, for decode KV
	reqs    []*req
	plan    *planner.Planner
	res     Result

	// The current window's figures, as a scrape would see them.
	winPrompt, winGen, winArrived, winOut int
	winTTFT, winITL                       planner.Histogram
}

// Run replays reqs (in arrival order) on the fleet cfg describes.
func Run(cfg Config, reqs []Request) (Result, error) {
	if cfg.PageSize <= 0 {
		cfg.PageSize = 16
	}
	if cfg.Prefill < 1 || cfg.Decode < 1 {
		return Result{}, fmt.Errorf("fleetsim: at least one worker of each role")
	}
	s := &sim{cfg: cfg}
	if cfg.Planner != nil {
		pc := *cfg.Planner
		pc.SLO, pc.Capacity = cfg.SLO, cfg.Capacity
		p, err := planner.New(pc)
		if err != nil {
			return Result{}, err
		}
		s.plan = p
		if s.cfg.Interval <= 0 {
			s.cfg.Interval = 15 * time.Second
		}
	}
	s.resetWindow()
	for range cfg.Prefill {
		s.addPrefill(0)
	}
	for range cfg.Decode {
		s.addDecode(0)
	}
	var last time.Duration
	for _, r := range reqs {
		q := &req{Request: r}
		pages := (r.Prompt + r.Output + s.cfg.PageSize - 1) / s.cfg.PageSize
		q.kvTokens = pages * s.cfg.PageSize
		if q.kvTokens > cfg.Capacity.KVTokens {
			return Result{}, fmt.Errorf("fleetsim: a request of %d tokens does not fit a decode pool of %d", r.Prompt+r.Output, cfg.Capacity.KVTokens)
		}
		s.reqs = append(s.reqs, q)
		s.at(r.Arrival, func() { s.arrive(q) })
		last = max(last, r.Arrival)
	}
	if s.plan != nil {
		var tick func()
		tick = func() {
			s.planStep()
			if s.now < last {
				s.at(s.now+s.cfg.Interval, tick)
			}
		}
		s.at(s.cfg.Interval, tick)
	}
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(*event)
		s.now = e.at
		e.do()
	}
	s.finish()
	return s.res, nil
}

func (s *sim) at(t time.Duration, do func()) {
	s.seq++
	heap.Push(&s.q, &event{at: t, seq: s.seq, do: do})
}

func (s *sim) addPrefill(delay time.Duration) {
	w := &prefillW{worker: worker{role: planner.Prefill, added: s.now, readyAt: s.now + delay}}
	s.prefill = append(s.prefill, w)
}

func (s *sim) addDecode(delay time.Duration) {
	w := &decodeW{worker: worker{role: planner.Decode, added: s.now, readyAt: s.now + delay}, kvFree: s.cfg.Capacity.KVTokens}
	s.decode = append(s.decode, w)
	if delay > 0 {
		s.at(s.now+delay, s.retryWaiting)
	}
}

// arrive reserves decode KV first, as the router does, and queues at the
// router when no decode worker has room.
func (s *sim) arrive(r *req) {
	s.winArrived++
	s.winPrompt += r.Prompt
	s.winOut += r.Output
	if len(s.waiting) > 0 || !s.reserve(r) {
		s.waiting = append(s.waiting, r)
	}
}

// reserve picks the ready decode worker with the fewest requests that has
// room for r's whole sequence, then the prefill worker with the least work.
func (s *sim) reserve(r *req) bool {
	var d *decodeW
	for _, w := range s.decode {
		if w.ready(s.now) && w.kvFree >= r.kvTokens && (d == nil || w.held < d.held) {
			d = w
		}
	}
	var p *prefillW
	for _, w := range s.prefill {
		if w.ready(s.now) && (p == nil || w.work < p.work) {
			p = w
		}
	}
	if d == nil || p == nil {
		return false
	}
	d.kvFree -= r.kvTokens
	d.held++
	r.decode = d
	p.queue = append(p.queue, r)
	p.work += r.Prompt
	if !p.busy {
		s.prefillNext(p)
	}
	return true
}

func (s *sim) retryWaiting() {
	for len(s.waiting) > 0 && s.reserve(s.waiting[0]) {
		s.waiting = s.waiting[1:]
	}
}

func (s *sim) prefillNext(p *prefillW) {
	if len(p.queue) == 0 {
		p.busy = false
		s.leaveIfEmpty(&p.worker, true)
		return
	}
	r := p.queue[0]
	p.queue = p.queue[1:]
	p.busy = true
	s.at(s.now+s.cfg.Capacity.PrefillTime(float64(r.Prompt)), func() {
		p.work -= r.Prompt
		// Prefill samples the first token; it reaches the client once
		// the KV is handed over and decode has checked the Commit.
		s.at(s.now+s.cfg.Capacity.Handoff, func() { s.handedOver(r) })
		s.prefillNext(p)
	})
}

func (s *sim) handedOver(r *req) {
	r.firstToken, r.lastToken, r.generated = s.now, s.now, 1
	s.winGen++
	s.observe(&s.winTTFT, (r.firstToken - r.Arrival).Seconds())
	d := r.decode
	if r.Output <= 1 {
		s.done(r)
		return
	}
	d.joining = append(d.joining, r)
	if !d.stepping {
		s.step(d)
	}
}

// step runs one decode step: sequences waiting join the batch up to its
// bound, and every sequence in it gains a token when the step ends.
func (s *sim) step(d *decodeW) {
	for len(d.joining) > 0 && len(d.batch) < s.cfg.Capacity.DecodeMaxBatch {
		d.batch = append(d.batch, d.joining[0])
		d.joining = d.joining[1:]
	}
	if len(d.batch) == 0 {
		d.stepping = false
		s.leaveIfEmpty(&d.worker, d.held == 0)
		return
	}
	d.stepping = true
	s.at(s.now+s.cfg.Capacity.StepTime(float64(len(d.batch))), func() {
		kept := d.batch[:0]
		for _, r := range d.batch {
			gap := s.now - r.lastToken
			r.itlSum += gap
			r.lastToken = s.now
			r.generated++
			s.winGen++
			s.observe(&s.winITL, gap.Seconds())
			if r.generated >= r.Output {
				s.done(r)
				continue
			}
			kept = append(kept, r)
		}
		clear(d.batch[len(kept):])
		d.batch = kept
		s.step(d)
	})
}

func (s *sim) done(r *req) {
	r.done = true
	d := r.decode
	d.kvFree += r.kvTokens
	d.held--
	s.res.End = max(s.res.End, s.now)
	s.retryWaiting()
}

// leaveIfEmpty lets a draining worker go once it holds nothing.
func (s *sim) leaveIfEmpty(w *worker, empty bool) {
	if w.draining && w.left == 0 && empty {
		w.left = s.now
	}
}

func (s *sim) observe(h *planner.Histogram, v float64) {
	for i, b := range h.Bounds {
		if v <= b {
			h.Counts[i]++
		}
	}
	h.Count++
}

func (s *sim) resetWindow() {
	s.winPrompt, s.winGen, s.winArrived, s.winOut = 0, 0, 0, 0
	fresh := func() planner.Histogram {
		return planner.Histogram{Bounds: latencyBuckets, Counts: make([]float64, len(latencyBuckets))}
	}
	s.winTTFT, s.winITL = fresh(), fresh()
}

// planStep shows the planner the window just ended, as the router's loop
// would from the workers' metrics, and applies its decision.
func (s *sim) planStep() {
	win := s.cfg.Interval.Seconds()
	o := planner.Observation{
		Window:             s.cfg.Interval,
		PromptTokensPerSec: float64(s.winPrompt) / win,
		GenTokensPerSec:    float64(s.winGen) / win,
		RouterQueued:       len(s.waiting),
		TTFTP99:            time.Duration(s.winTTFT.Quantile(0.99) * float64(time.Second)),
		ITLP99:             time.Duration(s.winITL.Quantile(0.99) * float64(time.Second)),
	}
	if s.winArrived > 0 {
		o.MeanPromptTokens = float64(s.winPrompt) / float64(s.winArrived)
		o.MeanOutputTokens = float64(s.winOut) / float64(s.winArrived)
	}
	for _, w := range s.prefill {
		if w.ready(s.now) {
			o.Prefill++
			o.PrefillQueued += len(w.queue)
		}
	}
	for _, w := range s.decode {
		if w.ready(s.now) {
			o.Decode++
			o.DecodeRunning += len(w.batch)
			o.KVUsage = max(o.KVUsage, 1-float64(w.kvFree)/float64(s.cfg.Capacity.KVTokens))
		}
	}
	d := s.plan.Decide(time.Unix(0, 0).Add(s.now), o)
	s.resetWindow()
	for _, rd := range []planner.RoleDecision{d.Prefill, d.Decode} {
		if rd.Changed() {
			s.res.Changes = append(s.res.Changes, rd)
		}
	}
	s.resize(planner.Prefill, d.Prefill.Desired)
	s.resize(planner.Decode, d.Decode.Desired)
}

// resize moves a role to n workers in the fleet: adds start after the
// delay; removals take the newest first (a starting worker goes at once),
// and a serving one drains.
func (s *sim) resize(role string, n int) {
	var ws []*worker
	if role == planner.Prefill {
		for _, w := range s.prefill {
			ws = append(ws, &w.worker)
		}
	} else {
		for _, w := range s.decode {
			ws = append(ws, &w.worker)
		}
	}
	var in []*worker
	for _, w := range ws {
		if !w.draining && w.left == 0 {
			in = append(in, w)
		}
	}
	for i := len(in); i < n; i++ {
		if role == planner.Prefill {
			s.addPrefill(s.cfg.StartupDelay)
		} else {
			s.addDecode(s.cfg.StartupDelay)
		}
	}
	slices.SortStableFunc(in, func(a, b *worker) int { return int(b.added - a.added) })
	for i := 0; i < len(in)-n; i++ {
		w := in[i]
		w.draining = true
		if s.now < w.readyAt {
			w.left = s.now
			continue
		}
		if role == planner.Prefill {
			for _, p := range s.prefill {
				if &p.worker == w {
					s.leaveIfEmpty(w, !p.busy && len(p.queue) == 0)
				}
			}
		} else {
			for _, d := range s.decode {
				if &d.worker == w {
					s.leaveIfEmpty(w, d.held == 0)
				}
			}
		}
	}
}

func (s *sim) finish() {
	end := max(s.res.End, s.now)
	s.res.End = end
	hours := func(w *worker) float64 {
		left := w.left
		if left == 0 {
			left = end
		}
		return (left - w.added).Hours()
	}
	for _, w := range s.prefill {
		s.res.PrefillHours += hours(&w.worker)
	}
	for _, w := range s.decode {
		s.res.DecodeHours += hours(&w.worker)
	}
	s.res.WorkerHours = s.res.PrefillHours + s.res.DecodeHours
	s.res.MaxPrefill, s.res.MaxDecode = maxConcurrent(s.prefill, func(w *prefillW) *worker { return &w.worker }, end),
		maxConcurrent(s.decode, func(w *decodeW) *worker { return &w.worker }, end)
	var ttft, itl []float64
	for _, r := range s.reqs {
		s.res.Requests++
		t := (r.firstToken - r.Arrival).Seconds()
		mean := 0.0
		if r.generated > 1 {
			mean = r.itlSum.Seconds() / float64(r.generated-1)
		}
		ttft, itl = append(ttft, t), append(itl, mean)
		okT, okI := r.done && t <= s.cfg.SLO.TTFT.Seconds(), r.done && mean <= s.cfg.SLO.ITL.Seconds()
		if okT {
			s.res.TTFTMet++
		}
		if okI {
			s.res.ITLMet++
		}
		if okT && okI {
			s.res.Met++
		}
	}
	s.res.TTFTP50, s.res.TTFTP99 = percentile(ttft, 0.5), percentile(ttft, 0.99)
	s.res.ITLP50, s.res.ITLP99 = percentile(itl, 0.5), percentile(itl, 0.99)
}

// maxConcurrent is the most workers of a role in the fleet at once.
func maxConcurrent[W any](ws []W, base func(W) *worker, end time.Duration) int {
	type edge struct {
		at time.Duration
		d  int
	}
	var es []edge
	for _, w := range ws {
		b := base(w)
		left := b.left
		if left == 0 {
			left = end + 1
		}
		es = append(es, edge{b.added, 1}, edge{left, -1})
	}
	slices.SortFunc(es, func(a, b edge) int {
		if a.at != b.at {
			return int(a.at - b.at)
		}
		return a.d - b.d
	})
	n, most := 0, 0
	for _, e := range es {
		n += e.d
		most = max(most, n)
	}
	return most
}

func percentile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	return v[min(len(v)-1, int(q*float64(len(v))))]
}
