package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/pflag"

	"github.com/batonlm/baton/internal/tracing"
)

// tracingFlags are serve's OpenTelemetry flags (every role).
type tracingFlags struct {
	endpoint string
	ratio    float64
}

func (t *tracingFlags) register(fs *pflag.FlagSet) {
	fs.StringVar(&t.endpoint, "otlp-traces-endpoint", "", "send OpenTelemetry traces over OTLP/HTTP to this collector: host:port or an http(s):// URL (path /v1/traces unless given); empty: no tracing")
	fs.Float64Var(&t.ratio, "otlp-traces-sample-ratio", 1, "share of requests traced, decided where a request enters (router, standalone); workers follow the router")
}

func (t *tracingFlags) validate() error {
	if t.ratio < 0 || t.ratio > 1 {
		return fmt.Errorf("--otlp-traces-sample-ratio %v: must be between 0 and 1", t.ratio)
	}
	return nil
}

// start turns tracing on for role; stop flushes the spans not yet sent,
// waiting at most five seconds for the collector.
func (t *tracingFlags) start(role string) (stop func(), err error) {
	shutdown, err := tracing.Setup(tracing.Config{Endpoint: t.endpoint, SampleRatio: t.ratio, Role: role, Version: currentBuild().Version})
	if err != nil {
		return func() {}, err
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(ctx)
	}, nil
}
