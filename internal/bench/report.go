package bench

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// WriteText prints the report as a table laid out like vLLM's and SGLang's
// serving benchmarks, so that runs against either read side by side.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	line := func(label string, format string, v any) {
		fmt.Fprintf(&b, "%-40s "+format+"\n", label+":", v)
	}
	rule := func(title string) {
		pad := max(0, 50-len(title)-2)
		fmt.Fprintf(&b, "%s %s %s\n", strings.Repeat("-", pad/2), title, strings.Repeat("-", pad-pad/2))
	}
	fmt.Fprintf(&b, "%s Serving Benchmark Result %s\n", strings.Repeat("=", 12), strings.Repeat("=", 12))
	line("Model", "%s", r.Model)
	line("Concurrency", "%d", r.Concurrency)
	if r.RequestRate > 0 {
		line("Request rate (req/s)", "%.2f", r.RequestRate)
	} else {
		line("Request rate (req/s)", "%s", "inf")
	}
	if r.WarmupRequests > 0 {
		line("Warm-up requests (not counted)", "%d", r.WarmupRequests)
	}
	line("Successful requests", "%d", r.Completed)
	line("Failed requests", "%d", r.Failed)
	line("Benchmark duration (s)", "%.2f", r.DurationS)
	line("Total input tokens", "%d", r.TotalInputTokens)
	line("Mean input tokens", "%.1f", r.MeanInputTokens)
	if !r.PromptsMeasured {
		b.WriteString("(the server has no /tokenize: prompts are --input-len words, about as many tokens in the usual vocabularies)\n")
	}
	line("Total generated tokens", "%d", r.TotalOutputTokens)
	if r.SharedPrefixLen > 0 {
		line("Shared prefixes", "%s", fmt.Sprintf("%d of %d words", r.NumPrefixes, r.SharedPrefixLen))
	}
	if r.Echo {
		line("Workload", "%s", "echo (repeat the prompt's text)")
	}
	line("Total cached input tokens", "%d", r.TotalCachedTokens)
	if !r.UsageReported && r.Completed > 0 {
		b.WriteString("(the server reported no usage: input tokens are --input-len per prompt, output tokens are streamed chunks)\n")
	}
	line("Request throughput (req/s)", "%.2f", r.RequestThroughput)
	line("Output token throughput (tok/s)", "%.2f", r.OutputThroughput)
	line("Total token throughput (tok/s)", "%.2f", r.TotalTokenThroughput)
	line("Max concurrent requests", "%d", r.MaxConcurrentRequests)
	if r.SpecDraftTokens > 0 {
		line("Speculative draft tokens", "%.0f", r.SpecDraftTokens)
		line("Speculative accepted tokens", "%.0f", r.SpecAcceptedTokens)
		line("Speculative accept rate", "%.3f", r.SpecAcceptRate)
	}
	if r.MigrationsTotal > 0 {
		reasons := make([]string, 0, len(r.Migrations))
		for why, n := range r.Migrations {
			reasons = append(reasons, fmt.Sprintf("%s %.0f", why, n))
		}
		slices.Sort(reasons)
		line("Migrated requests", "%s", fmt.Sprintf("%d (%s)", r.MigrationsTotal, strings.Join(reasons, ", ")))
	}
	for _, s := range []struct {
		title, short string
		st           Stats
	}{
		{"Time to First Token", "TTFT", r.TTFT},
		{"Time per Output Token (excl. 1st token)", "TPOT", r.TPOT},
		{"Inter-token Latency", "ITL", r.ITL},
		{"End-to-end Latency", "E2E Latency", r.E2E},
	} {
		rule(s.title)
		line("Mean "+s.short+" (ms)", "%.2f", s.st.Mean)
		line("P50 "+s.short+" (ms)", "%.2f", s.st.P50)
		line("P90 "+s.short+" (ms)", "%.2f", s.st.P90)
		line("P99 "+s.short+" (ms)", "%.2f", s.st.P99)
	}
	if r.MigrationsTotal > 0 {
		rule("Migration stall (longest token gap less median ITL)")
		line("P50 stall (ms)", "%.2f", r.MigrationStall.P50)
		line("P99 stall (ms)", "%.2f", r.MigrationStall.P99)
	}
	if len(r.Errors) > 0 {
		rule("Errors")
		for _, e := range r.Errors {
			fmt.Fprintf(&b, "%6d  %s\n", e.Count, e.Message)
		}
	}
	b.WriteString(strings.Repeat("=", 50) + "\n")
	_, err := io.WriteString(w, b.String())
	return err
}
