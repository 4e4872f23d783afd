package bench

import (
	"bufio"
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// migrationCounters reads a baton router's baton_router_migrations_total
// from its /metrics, by reason; ok is false when the server exposes none.
func migrationCounters(ctx context.Context, client *http.Client, base, apiKey string) (byReason map[string]float64, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return nil, false
	}
	if apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+apiKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, false
	}
	defer drainClose(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, false
	}
	byReason = map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// baton_router_migrations_total{...,reason="drain",...} 3
		labels, found := strings.CutPrefix(sc.Text(), "baton_router_migrations_total{")
		if !found {
			continue
		}
		labels, value, found := strings.Cut(labels, "} ")
		_, reason, hasReason := strings.Cut(labels, `reason="`)
		reason, _, _ = strings.Cut(reason, `"`)
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); found && hasReason && err == nil {
			byReason[reason] += v
			ok = true
		}
	}
	return byReason, ok
}

// migrationFigures sets the run's migrations (the counters' growth) and
// what they cost: a request that migrates waits once, between two of its
// tokens, for the new pair to prefill its prompt and the tokens sent. The
// migrated requests are taken as the as many completed requests with the
// longest such gap, and each one's stall is that gap less the run's median
// inter-token latency.
func (rep *Report) migrationFigures(before, after map[string]float64, results []result) {
	rep.Migrations = map[string]float64{}
	for why, v := range after {
		if d := v - before[why]; d > 0 {
			rep.Migrations[why] = d
			rep.MigrationsTotal += int(d)
		}
	}
	var gaps []time.Duration
	for _, r := range results {
		if r.err == nil && len(r.itl) > 0 {
			gaps = append(gaps, slices.Max(r.itl))
		}
	}
	slices.Sort(gaps)
	n := min(rep.MigrationsTotal, len(gaps))
	median := time.Duration(rep.ITL.P50 * float64(time.Millisecond))
	stalls := make([]time.Duration, 0, n)
	for _, g := range gaps[len(gaps)-n:] {
		stalls = append(stalls, max(0, g-median))
	}
	rep.MigrationStall = stats(stalls)
}
