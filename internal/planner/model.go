package planner

import (
	"fmt"
	"math"
)

// current is the count a reactive rule adds to: the planner's last desired
// count once it has one (workers it asked for may still be starting, and
// must not be asked for twice), else what is ready.
func (p *Planner) current(role string, ready int) int {
	if st := p.roles[role]; st.started {
		return st.desired
	}
	return max(ready, p.cfg.Min)
}

// prefillNeed sizes prefill for load times f. The workers are n servers
// behind one queue (the router spreads requests over them), each serving a
// mean prompt in S; an M/M/n queue's 99th percentile wait, plus S and the
// handoff, must fit in the TTFT SLO's headroom. Exponential service is
// pessimistic next to real prompts, which is the safe side. Seen TTFT over
// its SLO while requests queue at prefill asks for one more whatever the
// model says: the model's capacity may be stale.
func (p *Planner) prefillNeed(o Observation, f float64) (int, string, string) {
	c, cfg := p.cfg.Capacity, p.cfg
	meanP := o.MeanPromptTokens
	if meanP <= 0 {
		meanP = 1
	}
	s := c.PrefillTime(meanP).Seconds()
	lambda := f * o.PromptTokensPerSec / meanP
	budget := cfg.Headroom*cfg.SLO.TTFT.Seconds() - c.Handoff.Seconds()
	n, reason := cfg.Min, ReasonTTFTModel
	why := fmt.Sprintf("%.0f prompt tok/s, %.0f per worker; mean prompt %.0f tok in %.0fms", o.PromptTokensPerSec*f, c.PrefillTokensPerSec, meanP, 1000*s)
	switch {
	case lambda <= 0:
	case s >= budget:
		// No count of workers brings one prompt under the SLO; keep
		// them from queueing at least.
		n, reason = int(math.Ceil(lambda*s/0.8)), ReasonUnreachable
	default:
		n = cfg.Max
		for k := max(cfg.Min, int(math.Ceil(lambda*s))); k <= cfg.Max; k++ {
			if w := waitP99(k, lambda, 1/s); s+w <= budget {
				n = k
				why += fmt.Sprintf("; %d workers: p99 wait %.0fms + service within %.0fms", k, 1000*w, 1000*budget)
				break
			}
		}
	}
	if cur := p.current(Prefill, o.Prefill); o.TTFTP99 > cfg.SLO.TTFT && o.PrefillQueued >= max(1, o.Prefill) && n <= cur {
		n, reason = cur+1, ReasonPrefillQueue
		why = fmt.Sprintf("TTFT p99 %s over %s with %d queued at prefill", o.TTFTP99, cfg.SLO.TTFT, o.PrefillQueued)
	}
	return max(n, cfg.Min), reason, why
}

// waitP99 is the 99th percentile of the wait in an M/M/n queue with
// arrival rate lambda and service rate mu per server: with C the Erlang C
// probability of waiting, P(W > t) = C·e^(−(nμ−λ)t).
func waitP99(n int, lambda, mu float64) float64 {
	a := lambda / mu
	if a >= float64(n) {
		return math.Inf(1)
	}
	// Erlang B by its recurrence, then C from B.
	b := 1.0
	for k := 1; k <= n; k++ {
		b = a * b / (float64(k) + a*b)
	}
	rho := a / float64(n)
	cw := b / (1 - rho*(1-b))
	if cw <= 0.01 {
		return 0
	}
	return math.Log(100*cw) / (float64(n)*mu - lambda)
}

// decodeNeed sizes decode for load times f. Each decode worker steps its
// whole batch at once, a step of b sequences taking base + b·k, and each
// sequence gains one token a step; so g tokens/s on a worker keep
// b = g·base/(1−g·k) sequences in flight at an ITL of base + b·k. The
// fewest workers whose ITL fits the SLO's headroom and whose batch and KV
// (with room for the usual fluctuation, three standard deviations of a
// Poisson count) hold their sequences, plus those reserved while their
// prompt is prefilled, is the need. Seen ITL over its SLO, or KV nearly
// full, or requests queued at the router for decode KV, asks for one more.
func (p *Planner) decodeNeed(o Observation, f float64) (int, string, string) {
	c, cfg := p.cfg.Capacity, p.cfg
	g := f * o.GenTokensPerSec
	if o.MeanPromptTokens > 0 && o.MeanOutputTokens > 0 {
		// The arrivals' demand: decode's own rate stops growing when it
		// is saturated, the arrivals' does not.
		g = max(g, f*o.PromptTokensPerSec/o.MeanPromptTokens*o.MeanOutputTokens)
	}
	base, k := c.DecodeStepBase.Seconds(), c.DecodeStepPerSeq.Seconds()
	target := cfg.Headroom * cfg.SLO.ITL.Seconds()
	seq := o.MeanPromptTokens + o.MeanOutputTokens
	if seq <= 0 {
		seq = 1
	}
	var reqRate float64
	if o.MeanOutputTokens > 0 {
		reqRate = g / o.MeanOutputTokens
	}
	n, reason := cfg.Min, ReasonITLModel
	why := fmt.Sprintf("%.0f output tok/s; step %s + %s per sequence", g, c.DecodeStepBase, c.DecodeStepPerSeq)
	switch {
	case g <= 0:
	case base >= target:
		n, reason = int(math.Ceil(g*k/0.8)), ReasonUnreachable
	default:
		n = cfg.Max
		firstITL := 0 // the fewest workers whose ITL alone fits
		for w := max(cfg.Min, 1); w <= cfg.Max; w++ {
			gw := g / float64(w)
			if gw*k >= 1 {
				continue
			}
			b := gw * base / (1 - gw*k)
			itl := base + b*k
			if itl > target {
				continue
			}
			if firstITL == 0 {
				firstITL = w
			}
			held := b + reqRate/float64(w)*cfg.SLO.TTFT.Seconds()
			spread := 3 * math.Sqrt(held)
			if b+spread > float64(c.DecodeMaxBatch) || (held+spread)*seq > 0.9*float64(c.KVTokens) {
				continue
			}
			n = w
			if w > firstITL {
				reason = ReasonKVModel
				why += fmt.Sprintf("; %d workers: %.1f sequences held, %.0f KV tokens at peak of %d", w, held, (held+spread)*seq, c.KVTokens)
			} else {
				why += fmt.Sprintf("; %d workers: batch %.1f, ITL %.1fms within %.1fms", w, b, 1000*itl, 1000*target)
			}
			break
		}
	}
	cur := p.current(Decode, o.Decode)
	switch {
	case n > cur:
	case o.ITLP99 > cfg.SLO.ITL:
		n, reason = cur+1, ReasonITLBreach
		why = fmt.Sprintf("ITL p99 %s over %s", o.ITLP99, cfg.SLO.ITL)
	case o.KVUsage > 0.9 || o.RouterQueued > 0:
		n, reason = cur+1, ReasonKVPressure
		why = fmt.Sprintf("KV use %.0f%%, %d queued at the router for decode KV", 100*o.KVUsage, o.RouterQueued)
	}
	return max(n, cfg.Min), reason, why
}
