// Package planner decides how many prefill and how many decode workers a
// load needs to meet its latency SLOs. It is pure: what the fleet did in the
// last window, what one worker of each role can do and the clock go in; the
// replica counts and why come out. Scraping, exporting and applying the
// decision are other packages' work, so the router's loop and the fleet
// simulator run the very same decisions.
package planner

import (
	"fmt"
	"time"
)

// Role names as the workers' metrics and the exported gauge spell them.
const (
	Prefill = "prefill"
	Decode  = "decode"
)

// SLO is the latency a request must see: its first token within TTFT, and
// its tokens after the first at most ITL apart on average.
type SLO struct {
	TTFT time.Duration `json:"ttft"`
	ITL  time.Duration `json:"itl"`
}

// Capacity is what one worker of each role does, as measured (baton bench
// serve against a real pair, see the README's "Sizing the pools").
type Capacity struct {
	// PrefillTokensPerSec is one prefill worker's prompt tokens per second
	// when busy; PrefillOverhead is its fixed cost per request.
	PrefillTokensPerSec float64       `json:"prefill_tokens_per_sec"`
	PrefillOverhead     time.Duration `json:"prefill_overhead"`
	// Handoff is the time from prefill's last chunk to the first token
	// reaching the client: KV transfer, Commit and its checks.
	Handoff time.Duration `json:"handoff"`
	// A decode step of a batch of b sequences takes DecodeStepBase +
	// b × DecodeStepPerSeq.
	DecodeStepBase   time.Duration `json:"decode_step_base"`
	DecodeStepPerSeq time.Duration `json:"decode_step_per_seq"`
	// DecodeMaxBatch is a decode worker's --max-running-requests;
	// KVTokens its pool in tokens. A decode reservation holds a
	// request's whole sequence (prompt and max_tokens).
	DecodeMaxBatch int `json:"decode_max_batch"`
	KVTokens       int `json:"kv_tokens"`
}

// StepTime is a decode step's time with b sequences in the batch.
func (c Capacity) StepTime(b float64) time.Duration {
	return c.DecodeStepBase + time.Duration(b*float64(c.DecodeStepPerSeq))
}

// PrefillTime is one prefill worker's time for a prompt of n tokens.
func (c Capacity) PrefillTime(n float64) time.Duration {
	return c.PrefillOverhead + seconds(n/c.PrefillTokensPerSec)
}

func (c Capacity) check() error {
	switch {
	case c.PrefillTokensPerSec <= 0:
		return fmt.Errorf("planner: prefill tokens/s must be positive")
	case c.DecodeStepBase <= 0 || c.DecodeStepPerSeq < 0:
		return fmt.Errorf("planner: decode step time must be positive")
	case c.DecodeMaxBatch <= 0 || c.KVTokens <= 0:
		return fmt.Errorf("planner: decode batch and KV tokens must be positive")
	}
	return nil
}

// Observation is what the fleet did over the last Window, summed over the
// workers of each role. Zero means unknown (or none) throughout.
type Observation struct {
	Window time.Duration
	// PromptTokensPerSec and GenTokensPerSec are the offered load:
	// prompt tokens prefilled and tokens generated per second.
	PromptTokensPerSec float64
	GenTokensPerSec    float64
	// Mean prompt and output length of the requests that arrived.
	MeanPromptTokens float64
	MeanOutputTokens float64
	// PrefillQueued: requests waiting on prefill workers; RouterQueued:
	// requests the router holds for want of decode KV.
	PrefillQueued int
	RouterQueued  int
	// DecodeRunning: sequences in decode batches; KVUsage: the fullest
	// decode worker's share of its pool in use.
	DecodeRunning int
	KVUsage       float64
	// TTFTP99 and ITLP99 are the window's 99th percentiles.
	TTFTP99 time.Duration
	ITLP99  time.Duration
	// Ready workers of each role now.
	Prefill, Decode int
}

// Config is the planner's targets and damping.
type Config struct {
	SLO      SLO
	Capacity Capacity
	// Headroom is the share of each SLO the model sizes for (0.8): the
	// rest absorbs what the model leaves out.
	Headroom float64
	// Band is the hysteresis: a scale-down is sized for the load
	// (1+Band) times what was seen, so noise around a step does not flap.
	Band float64
	// UpCooldown is the least time between two scale-ups of a role;
	// DownCooldown the least time after any change before a scale-down.
	UpCooldown, DownCooldown time.Duration
	// DownWindow is how long the load must have allowed fewer workers
	// before a role scales down; it goes to the most any moment of the
	// window asked for (as the HPA's stabilization window does).
	DownWindow time.Duration
	// Min and Max bound each role's replicas.
	Min, Max int
}

// Defaults fills what c leaves zero.
func (c Config) Defaults() Config {
	if c.Headroom <= 0 {
		c.Headroom = 0.8
	}
	if c.Band <= 0 {
		c.Band = 0.2
	}
	if c.UpCooldown <= 0 {
		c.UpCooldown = time.Minute
	}
	if c.DownCooldown <= 0 {
		c.DownCooldown = 3 * time.Minute
	}
	if c.DownWindow <= 0 {
		c.DownWindow = 5 * time.Minute
	}
	if c.Min <= 0 {
		c.Min = 1
	}
	if c.Max <= 0 {
		c.Max = 64
	}
	return c
}

// Reasons a role's desired count is what it is. They are label values of
// the exported gauge, so the set is small and fixed.
const (
	ReasonTTFTModel    = "ttft_model"      // the queueing model of prefill against the TTFT SLO
	ReasonPrefillQueue = "prefill_queue"   // TTFT seen over its SLO with requests queued at prefill
	ReasonITLModel     = "itl_model"       // the batch-size model of decode against the ITL SLO
	ReasonITLBreach    = "itl_breach"      // ITL seen over its SLO
	ReasonKVPressure   = "kv_pressure"     // decode KV nearly full, or requests queued at the router for it
	ReasonKVModel      = "kv_model"        // the sequences the load keeps in flight need this much KV
	ReasonCooldown     = "cooldown"        // more were wanted, but the last change is too recent
	ReasonDownPending  = "down_pending"    // fewer would do, but not yet for long enough
	ReasonSustainedLow = "sustained_low"   // fewer did for the whole down window: scaled down
	ReasonSteady       = "steady"          // the count is right
	ReasonUnreachable  = "slo_unreachable" // one worker alone takes longer than the SLO; sized for throughput only
	ReasonMinReplicas  = "min_replicas"
	ReasonMaxReplicas  = "max_replicas"
)

// Reasons lists every reason, for exporters that zero the ones not given.
var Reasons = []string{ReasonTTFTModel, ReasonPrefillQueue, ReasonITLModel, ReasonITLBreach, ReasonKVPressure, ReasonKVModel,
	ReasonCooldown, ReasonDownPending, ReasonSustainedLow, ReasonSteady, ReasonUnreachable, ReasonMinReplicas, ReasonMaxReplicas}

// RoleDecision is one role's outcome.
type RoleDecision struct {
	Role    string `json:"role"`
	Current int    `json:"current"` // the planner's previous desired count
	Desired int    `json:"desired"`
	// Need is what the load asks for now, before damping.
	Need   int    `json:"need"`
	Reason string `json:"reason"`
	// Why says it in words, for the log.
	Why string `json:"why"`
}

// Changed says whether the desired count moved.
func (d RoleDecision) Changed() bool { return d.Desired != d.Current }

func (d RoleDecision) String() string {
	return fmt.Sprintf("%s %d→%d (need %d, %s: %s)", d.Role, d.Current, d.Desired, d.Need, d.Reason, d.Why)
}

// Decision is both roles' outcome of one Decide.
type Decision struct {
	At      time.Time    `json:"at"`
	Prefill RoleDecision `json:"prefill"`
	Decode  RoleDecision `json:"decode"`
}

// Planner holds each role's damping state between decisions. It is not
// safe for concurrent use: one loop owns it.
type Planner struct {
	cfg   Config
	roles map[string]*roleState
}

type roleState struct {
	started    bool
	desired    int
	lastUp     time.Time
	lastChange time.Time
	// low holds the scale-down needs seen since the load last asked for
	// at least the current count; lowSince is when that run began.
	low      []sample
	lowSince time.Time
}

type sample struct {
	at   time.Time
	need int
}

// New makes a planner; the capacity must be a measured one.
func New(cfg Config) (*Planner, error) {
	cfg = cfg.Defaults()
	if err := cfg.Capacity.check(); err != nil {
		return nil, err
	}
	if cfg.SLO.TTFT <= 0 || cfg.SLO.ITL <= 0 {
		return nil, fmt.Errorf("planner: both SLOs must be positive")
	}
	if cfg.Min > cfg.Max {
		return nil, fmt.Errorf("planner: min %d above max %d", cfg.Min, cfg.Max)
	}
	return &Planner{cfg: cfg, roles: map[string]*roleState{Prefill: {}, Decode: {}}}, nil
}

// Config is the planner's configuration, defaults filled in.
func (p *Planner) Config() Config { return p.cfg }

// Decide is one planning step at now.
func (p *Planner) Decide(now time.Time, o Observation) Decision {
	pn, pr, pwhy := p.prefillNeed(o, 1)
	pdown, _, _ := p.prefillNeed(o, 1+p.cfg.Band)
	dn, dr, dwhy := p.decodeNeed(o, 1)
	ddown, _, _ := p.decodeNeed(o, 1+p.cfg.Band)
	return Decision{
		At:      now,
		Prefill: p.damp(Prefill, now, o.Prefill, pn, pdown, pr, pwhy),
		Decode:  p.damp(Decode, now, o.Decode, dn, ddown, dr, dwhy),
	}
}

// damp turns a role's need into its desired count: up at once unless a
// scale-up was too recent, down only to the most the down window asked
// for, once the low load lasted the whole window and the cool-down passed.
func (p *Planner) damp(role string, now time.Time, ready, need, downNeed int, reason, why string) RoleDecision {
	st := p.roles[role]
	if !st.started {
		st.started, st.desired = true, max(ready, p.cfg.Min)
	}
	cur := st.desired
	d := RoleDecision{Role: role, Current: cur, Desired: cur, Need: need, Reason: reason, Why: why}
	switch {
	case need > cur:
		st.low, st.lowSince = nil, time.Time{}
		if !st.lastUp.IsZero() && now.Sub(st.lastUp) < p.cfg.UpCooldown {
			d.Reason = ReasonCooldown
			d.Why = fmt.Sprintf("%s; last scale-up %s ago, cool-down %s", why, now.Sub(st.lastUp).Round(time.Second), p.cfg.UpCooldown)
			break
		}
		d.Desired = need
		st.lastUp, st.lastChange = now, now
	case downNeed < cur:
		if st.lowSince.IsZero() {
			st.lowSince = now
		}
		st.low = append(st.low, sample{now, downNeed})
		cut := 0
		for cut < len(st.low) && now.Sub(st.low[cut].at) > p.cfg.DownWindow {
			cut++
		}
		st.low = st.low[cut:]
		most := 0
		for _, s := range st.low {
			most = max(most, s.need)
		}
		switch {
		case now.Sub(st.lowSince) < p.cfg.DownWindow:
			d.Reason = ReasonDownPending
			d.Why = fmt.Sprintf("%s; %d would do at %.0f%% more load, for %s of the %s window", why, downNeed, 100*p.cfg.Band,
				now.Sub(st.lowSince).Round(time.Second), p.cfg.DownWindow)
		case !st.lastChange.IsZero() && now.Sub(st.lastChange) < p.cfg.DownCooldown:
			d.Reason = ReasonCooldown
			d.Why = fmt.Sprintf("%s; last change %s ago, cool-down %s", why, now.Sub(st.lastChange).Round(time.Second), p.cfg.DownCooldown)
		default:
			d.Desired = max(most, p.cfg.Min)
			d.Reason = ReasonSustainedLow
			d.Why = fmt.Sprintf("%s; at most %d needed (at %.0f%% more load) for %s", why, most, 100*p.cfg.Band, p.cfg.DownWindow)
			st.lastChange = now
			// The window starts again from the new count.
			st.low, st.lowSince = nil, time.Time{}
		}
	default:
		st.low, st.lowSince = nil, time.Time{}
		if need < cur {
			d.Reason = ReasonSteady
			d.Why = fmt.Sprintf("%s; %d would do, but not with %.0f%% more load", why, need, 100*p.cfg.Band)
		}
	}
	if d.Desired > p.cfg.Max {
		d.Desired, d.Reason = p.cfg.Max, ReasonMaxReplicas
	}
	if d.Desired < p.cfg.Min {
		d.Desired, d.Reason = p.cfg.Min, ReasonMinReplicas
	}
	st.desired = d.Desired
	return d
}

func seconds(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
