// Package metrics defines baton's Prometheus metrics. The names are part of
// the operator contract (dashboards and alerts use them) and do not change.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Set is one process's metrics, registered on its own registry so that
// several servers in one test binary do not collide.
type Set struct {
	Registry *prometheus.Registry
	// Registerer adds a role's own metrics (the router's) with the
	// set's model_name label.
	Registerer prometheus.Registerer
	Role       string

	KVPagesCapacity prometheus.Gauge
	KVPagesFree     prometheus.Gauge
	// TokenUsage is the fraction of the pool's pages in use (SGLang's
	// token_usage).
	TokenUsage         prometheus.Gauge
	KVPagesQuarantined prometheus.Gauge
	// Prefix cache: pages shared and unpinned (evictable), the prompt
	// tokens looked up and found, and the hit rate since start.
	KVPagesCached         prometheus.Gauge
	KVSharedWriteRefusals prometheus.Gauge
	PrefixCacheQueried    prometheus.Counter
	PrefixCacheHit        prometheus.Counter
	PrefixCacheHitRate    prometheus.Gauge
	// Hierarchical cache: pages found per tier (l1 the pool, l2 host
	// memory, l3 files), what loads moved and how long they took, the
	// requests that waited for a load, loads refused (checksum, miss),
	// each tier's bytes, and reads refused because a page was still
	// loading (anything but 0 is a bug).
	HiCacheHits         *prometheus.CounterVec // tier
	HiCacheLoadedBytes  prometheus.Counter
	HiCacheLoadSeconds  prometheus.Histogram
	HiCacheLoadWaits    prometheus.Counter
	HiCacheLoadFailures *prometheus.CounterVec // reason
	HiCacheBytes        *prometheus.GaugeVec   // tier
	HiCacheL3Dropped    prometheus.Counter
	HiCacheL3Forged     prometheus.Counter // L3 files whose MAC failed under the store key, removed
	KVReadBeforeReady   prometheus.Counter
	Requests            *prometheus.CounterVec // role, outcome
	Rejected            *prometheus.CounterVec // role, reason
	Running             prometheus.Gauge
	Queued              prometheus.Gauge
	TTFT                prometheus.Histogram
	ITL                 prometheus.Histogram
	E2E                 prometheus.Histogram
	PromptTokens        prometheus.Counter
	GenerationTokens    prometheus.Counter
	ReadGateFailures    prometheus.Counter
	NaNLogits           prometheus.Counter
	GrammarMaskSeconds  prometheus.Histogram
	GrammarRefusals     *prometheus.CounterVec // reason
	Preemptions         prometheus.Counter
	ReleaseErrors       prometheus.Gauge
	QueuedTotal         prometheus.Counter
	TransferSessions    prometheus.Counter

	// Prefill/decode handoff.
	ReservationsActive prometheus.Gauge
	ReservationsTotal  prometheus.Counter
	HandoffFailures    *prometheus.CounterVec // reason
	LateDropped        *prometheus.CounterVec // kind
	TransferBytes      prometheus.Counter
	// PagesShipped counts the pages a prefill worker shipped, by where
	// their rows went from: "device" (staged in the cuda-ipc arena, copied
	// by decode GPU to GPU) or "host" (read into host memory and sent).
	PagesShipped    *prometheus.CounterVec // from
	TransferSeconds prometheus.Histogram
	DrainWait       prometheus.Histogram
	// HandedBack counts requests a draining decode worker handed back to
	// the router (--drain-grace), which continues each elsewhere.
	HandedBack prometheus.Counter

	// Internal plane: calls and transfer sessions refused for want of a
	// cluster member's credentials, the right role or the reservation's
	// capability.
	InternalAuthFailures *prometheus.CounterVec // rpc

	// Speculative decoding: per finished request that speculated, its
	// tokens per verifying step and its share of drafts accepted; and the
	// draft tokens proposed and accepted.
	SpecAcceptLength   prometheus.Histogram
	SpecAcceptRate     prometheus.Histogram
	SpecDraftTokens    prometheus.Counter
	SpecAcceptedTokens prometheus.Counter
	// SpecAnomalies counts generations the spec guard stopped.
	SpecAnomalies prometheus.Counter

	// IllegalMoves counts lifecycle moves the engine made that the state
	// machine refused: a bug, never expected.
	IllegalMoves prometheus.Counter
}

var latencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// New makes and registers the metrics of one role, without a model_name
// label (tests, and tools that serve no model).
func New(role string) *Set { return ForModel(role, "") }

// ForModel makes and registers the metrics of one role serving model: each
// baton_ series carries model_name, as SGLang's do, so that one dashboard
// tells the models of a fleet apart.
func ForModel(role, model string) *Set {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var reg prometheus.Registerer = r
	if model != "" {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"model_name": model}, r)
	}
	c := prometheus.Labels{"role": role}
	s := &Set{
		Registry:           r,
		Registerer:         reg,
		Role:               role,
		KVPagesCapacity:    prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_pages_capacity", Help: "Pages in the KV pool.", ConstLabels: c}),
		TokenUsage:         prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_token_usage", Help: "Fraction of the KV pool's pages in use (held by requests or quarantined), 0 to 1.", ConstLabels: c}),
		KVPagesFree:        prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_pages_free", Help: "Free pages in the KV pool.", ConstLabels: c}),
		KVPagesQuarantined: prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_pages_quarantined", Help: "Pages whose request ended but whose writer has not confirmed it is drained.", ConstLabels: c}),
		KVPagesCached: prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_pages_cached",
			Help: "Prefix cache pages no request pins: kept for reuse, evicted (least recently used first) when an allocation needs them.", ConstLabels: c}),
		KVSharedWriteRefusals: prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_shared_write_refusals",
			Help: "Writes, marks and writer attachments aimed at a shared (prefix cache) page and refused; anything but 0 is a bug.", ConstLabels: c}),
		PrefixCacheQueried: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_prefix_cache_queried_tokens_total",
			Help: "Prompt tokens looked up in the prefix cache at admission.", ConstLabels: c}),
		PrefixCacheHit: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_prefix_cache_hit_tokens_total",
			Help: "Prompt tokens read from the prefix cache instead of computed.", ConstLabels: c}),
		PrefixCacheHitRate: prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_prefix_cache_hit_rate",
			Help: "Prefix cache hit tokens over queried tokens since start, 0 to 1.", ConstLabels: c}),
		HiCacheHits: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_hicache_hit_pages_total",
			Help: "Prompt pages found in the cache, by tier: l1 (the KV pool), l2 (host memory), l3 (files).", ConstLabels: c}, []string{"tier"}),
		HiCacheLoadedBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_hicache_loaded_bytes_total",
			Help: "KV bytes loaded from host memory or files back into the pool.", ConstLabels: c}),
		HiCacheLoadSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_hicache_load_seconds",
			Help: "Time to load one request's pages from the lower tiers (all of them, in page order).", Buckets: latencyBuckets, ConstLabels: c}),
		HiCacheLoadWaits: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_hicache_load_waits_total",
			Help: "Requests the scheduler held back because a page of theirs was still loading.", ConstLabels: c}),
		HiCacheLoadFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_hicache_load_failures_total",
			Help: "Page loads that ended as a miss (the request computes the page): checksum mismatch, or gone from its tier.", ConstLabels: c}, []string{"reason"}),
		HiCacheBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "baton_hicache_bytes",
			Help: "Bytes of KV pages kept in a lower tier: l2 (host memory), l3 (files).", ConstLabels: c}, []string{"tier"}),
		HiCacheL3Dropped: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_hicache_l3_dropped_pages_total",
			Help: "Pages L2 evicted that L3 never got: its write queue was full, or the store refused the write.", ConstLabels: c}),
		HiCacheL3Forged: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_hicache_forged_files_total",
			Help: "L3 page files whose MAC did not verify under the store key (written or altered without the key, or damaged): each was removed and its page computed instead.", ConstLabels: c}),
		KVReadBeforeReady: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_kv_read_before_ready_total",
			Help: "Reads the read gate refused because a page was still loading from a lower tier; anything but 0 is a bug.", ConstLabels: c}),
		Requests:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_requests_total", Help: "Requests by outcome."}, []string{"role", "outcome"}),
		Rejected:         prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_requests_rejected_total", Help: "Requests rejected at the door, by reason."}, []string{"role", "reason"}),
		Running:          prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_num_running_reqs", Help: "Requests in the running batch.", ConstLabels: c}),
		Queued:           prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_num_queue_reqs", Help: "Requests waiting for admission.", ConstLabels: c}),
		TTFT:             prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_time_to_first_token_seconds", Help: "Time from arrival to the first generated token.", Buckets: latencyBuckets, ConstLabels: c}),
		ITL:              prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_inter_token_latency_seconds", Help: "Time between consecutive generated tokens.", Buckets: latencyBuckets, ConstLabels: c}),
		E2E:              prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_e2e_request_latency_seconds", Help: "Time from arrival to the last token.", Buckets: latencyBuckets, ConstLabels: c}),
		PromptTokens:     prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_prompt_tokens_total", Help: "Prompt tokens prefilled.", ConstLabels: c}),
		GenerationTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_generation_tokens_total", Help: "Tokens generated.", ConstLabels: c}),
		ReadGateFailures: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_kv_read_gate_failures_total", Help: "Batch entries refused because a page was not the request's own or not written.", ConstLabels: c}),
		NaNLogits:        prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_nan_logits_total", Help: "Forward passes whose logits held NaN (poisoned KV was read); the request fails instead of sampling.", ConstLabels: c}),
		GrammarMaskSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_grammar_mask_seconds",
			Help: "Time to compute one constrained request's mask of allowed next tokens (off the engine loop).", Buckets: latencyBuckets, ConstLabels: c}),
		GrammarRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_grammar_refusals_total",
			Help: "Constrained requests failed with 400: their grammar admits no token, outgrew its states, or used up its mask work.", ConstLabels: c}, []string{"reason"}),
		Preemptions:        prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_preemptions_total", Help: "Running requests taken off a full batch for one that waited too long; they keep their pages and resume.", ConstLabels: c}),
		ReleaseErrors:      prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_release_errors", Help: "Page releases the pool refused (double or wrong-owner releases); anything but 0 is a bug.", ConstLabels: c}),
		QueuedTotal:        prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_requests_queued_total", Help: "Requests that entered the admission queue.", ConstLabels: c}),
		TransferSessions:   prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_kv_transfer_sessions_total", Help: "Transport sessions opened to write KV into a decode worker.", ConstLabels: c}),
		ReservationsActive: prometheus.NewGauge(prometheus.GaugeOpts{Name: "baton_kv_reservations_active", Help: "Decode reservations not yet ended.", ConstLabels: c}),
		ReservationsTotal:  prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_kv_reservations_total", Help: "Decode reservations made.", ConstLabels: c}),
		HandoffFailures:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_handoff_failures_total", Help: "Prefill-to-decode handoffs that failed, by the check or step that failed.", ConstLabels: c}, []string{"reason"}),
		LateDropped:        prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_late_messages_dropped_total", Help: "Writes, commits and acks for a room/epoch no longer live, dropped unread.", ConstLabels: c}, []string{"kind"}),
		TransferBytes:      prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_kv_transfer_bytes_total", Help: "KV bytes transferred (landed).", ConstLabels: c}),
		PagesShipped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_kv_pages_shipped_total",
			Help: "Prompt pages a prefill worker shipped, by where decode took their rows from: device (staged in GPU memory, cuda-ipc) or host.", ConstLabels: c}, []string{"from"}),
		TransferSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_kv_transfer_seconds", Help: "Time from the first page write to the flush that precedes Commit.", Buckets: latencyBuckets, ConstLabels: c}),
		DrainWait:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_drain_wait_seconds", Help: "Time aborted pages spent in quarantine waiting for their writer.", Buckets: latencyBuckets, ConstLabels: c}),
		HandedBack:      prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_requests_handed_back_total", Help: "Requests a draining decode worker handed back to the router, which continues each on another pair.", ConstLabels: c}),
		InternalAuthFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "baton_internal_auth_failures_total",
			Help: "Internal calls and transfer sessions refused: no or wrong cluster credentials, a role not allowed the call, or a wrong reservation capability.", ConstLabels: c}, []string{"rpc"}),
		SpecAcceptLength: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_spec_accept_length",
			Help: "Tokens emitted per verifying forward step of a finished request that speculated (accepted drafts plus the target's own token).", Buckets: []float64{1, 1.2, 1.4, 1.6, 2, 2.5, 3, 4, 5, 6, 8}, ConstLabels: c}),
		SpecAcceptRate: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "baton_spec_accept_rate",
			Help: "Share of a finished request's draft tokens that the target accepted, 0 to 1.", Buckets: []float64{0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.96, 1}, ConstLabels: c}),
		SpecDraftTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_spec_draft_tokens_total",
			Help: "Draft tokens proposed by speculative decoding and verified by the target.", ConstLabels: c}),
		SpecAcceptedTokens: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_spec_accepted_tokens_total",
			Help: "Draft tokens the target accepted.", ConstLabels: c}),
		SpecAnomalies: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_spec_anomalies_total",
			Help: "Generations the speculative decoding guard stopped (finish reason spec_anomaly): accept figures that say the KV is suspect.", ConstLabels: c}),
		IllegalMoves: prometheus.NewCounter(prometheus.CounterOpts{Name: "baton_lifecycle_illegal_moves_total",
			Help: "Request state changes the lifecycle refused; anything but 0 is a bug.", ConstLabels: c}),
	}
	// What every role serves; a router holds no pool, queue, engine or
	// transfer, so it exports none of their figures rather than zeros
	// that would read as an empty pool.
	reg.MustRegister(s.Requests, s.Rejected, s.Running, s.Queued, s.QueuedTotal, s.TTFT, s.ITL, s.E2E, s.PromptTokens, s.GenerationTokens)
	if role != "standalone" {
		reg.MustRegister(s.InternalAuthFailures)
	}
	if role != "router" {
		reg.MustRegister(s.KVPagesCapacity, s.KVPagesFree, s.KVPagesQuarantined, s.TokenUsage,
			s.ReadGateFailures, s.NaNLogits, s.Preemptions, s.ReleaseErrors, s.IllegalMoves,
			s.KVPagesCached, s.KVSharedWriteRefusals, s.PrefixCacheQueried, s.PrefixCacheHit, s.PrefixCacheHitRate,
			s.HiCacheHits, s.HiCacheLoadedBytes, s.HiCacheLoadSeconds, s.HiCacheLoadWaits, s.HiCacheLoadFailures, s.HiCacheBytes,
			s.HiCacheL3Dropped, s.KVReadBeforeReady, s.GrammarMaskSeconds, s.GrammarRefusals)
		for _, r := range []string{"no_token", "too_complex", "budget"} {
			s.GrammarRefusals.WithLabelValues(r)
		}
		reg.MustRegister(s.HiCacheL3Forged)
		for _, t := range []string{"l1", "l2", "l3"} {
			s.HiCacheHits.WithLabelValues(t)
		}
		for _, t := range []string{"l2", "l3"} {
			s.HiCacheBytes.WithLabelValues(t)
		}
		for _, r := range []string{"checksum", "gone"} {
			s.HiCacheLoadFailures.WithLabelValues(r)
		}
	}
	if role == "prefill" || role == "decode" {
		reg.MustRegister(s.TransferSessions, s.ReservationsActive, s.ReservationsTotal, s.HandoffFailures,
			s.TransferBytes, s.TransferSeconds, s.DrainWait)
	}
	if role == "decode" {
		reg.MustRegister(s.LateDropped, s.HandedBack)
	}
	if role == "prefill" {
		reg.MustRegister(s.PagesShipped)
		for _, from := range []string{"device", "host"} {
			s.PagesShipped.WithLabelValues(from)
		}
	}
	if role == "standalone" || role == "decode" {
		reg.MustRegister(s.SpecAcceptLength, s.SpecAcceptRate, s.SpecDraftTokens, s.SpecAcceptedTokens, s.SpecAnomalies)
	}
	// Labelled counters start at 0 for every label the role can count, so
	// that a rate() or an alert on them works before the first event.
	for _, o := range labels[role].outcomes {
		s.Requests.WithLabelValues(role, o)
	}
	for _, reason := range labels[role].rejects {
		s.Rejected.WithLabelValues(role, reason)
	}
	for _, reason := range labels[role].handoff {
		s.HandoffFailures.WithLabelValues(reason)
	}
	for _, k := range labels[role].late {
		s.LateDropped.WithLabelValues(k)
	}
	for _, rpc := range labels[role].rpcs {
		s.InternalAuthFailures.WithLabelValues(rpc)
	}
	return s
}

// roleLabels are the label values a role's counters can take.
type roleLabels struct {
	outcomes, rejects, handoff, late, rpcs []string
}

// doorRejects are the engine's door checks (scheduler.Engine.door).
var doorRejects = []string{"too_long", "empty_prompt", "bad_token"}

var labels = map[string]roleLabels{
	"standalone": {
		outcomes: []string{"finished", "aborted", "error", "rejected"},
		rejects:  append([]string{"queue_full", "shutting_down"}, doorRejects...),
	},
	"prefill": {
		outcomes: []string{"sent", "drained", "aborted", "error", "rejected"},
		rejects:  append([]string{"queue_full"}, doorRejects...),
		handoff:  []string{"layout", "transfer", "commit"},
		rpcs:     []string{"Info", "Prefill", "Abort", "Tokenizer", "tls", "transfer"},
	},
	"decode": {
		outcomes: []string{"finished", "aborted", "error", "rejected"},
		rejects:  append([]string{"no_space"}, doorRejects...),
		handoff:  []string{"layout", "timeout", "writer", "coverage", "over_claim", "first_token", "owner_tag", "checksum", "bad_count", "held_page"},
		late:     []string{"admit", "write", "commit", "drained", "closed", "abort"},
		rpcs:     []string{"Info", "Reserve", "Commit", "Drained", "Abort", "Finish", "Stream", "tls", "transfer"},
	},
	"router": {
		outcomes: []string{"finished", "aborted", "error", "rejected"},
		rejects:  []string{"too_long", "empty_prompt", "no_workers", "decode_full", "prefill_full", "workers_unavailable", "rejected_by_decode", "queue_full", "queue_timeout"},
		rpcs:     []string{"tls"},
	},
}

// Outcome counts one finished request.
func (s *Set) Outcome(outcome string) { s.Requests.WithLabelValues(s.Role, outcome).Inc() }

// Reject counts one rejected request.
func (s *Set) Reject(reason string) { s.Rejected.WithLabelValues(s.Role, reason).Inc() }

// Handler serves the registry in the Prometheus text format.
func (s *Set) Handler() http.Handler {
	return promhttp.HandlerFor(s.Registry, promhttp.HandlerOpts{Registry: s.Registry})
}
