package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/batonlm/baton/internal/auth"
	"github.com/batonlm/baton/internal/bundled"
	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/router"
	"github.com/batonlm/baton/internal/server"
	"github.com/batonlm/baton/internal/tokenizer"
)

// runRouter runs the front door of PD mode. It loads the tokenizer and chat
// template from the model file's metadata, never its weights; given no
// --model or --tokenizer, from the files a prefill worker hands over.
func runRouter(ctx context.Context, f *serveFlags, logw io.Writer) error {
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelInfo})).With("role", "router")
	tok, name, err := routerTokenizer(f)
	if err != nil {
		return err
	}
	genDir, learned := "", false
	if f.modelPath == "" && f.tokenizerPath == "" {
		ltok, lname, dir, err := learnTokenizer(f, log)
		switch {
		case err != nil:
			log.Warn("no prefill worker handed over its tokenizer; serving the bundled model's (give --model to choose)", "err", err)
		default:
			tok, name, genDir, learned = ltok, lname, dir, true
			if dir != "" {
				defer os.RemoveAll(dir)
			}
		}
	}
	if f.servedName != "" {
		name = f.servedName
	}
	var defaults server.SamplingDefaults
	if dir, ok := model.HFDir(f.modelPath); ok || genDir != "" {
		if !ok {
			dir = genDir
		}
		gen, err := model.ReadGenerationConfig(dir)
		if err != nil {
			return err
		}
		defaults = samplingDefaults(gen)
	}
	tmpl, err := chatTemplate(f, tok, log)
	if err != nil {
		return err
	}
	ms := metrics.ForModel("router", name)
	plane, err := f.internal.plane(auth.RoleRouter, log, ms)
	if err != nil {
		return err
	}
	rt, err := router.New(router.Options{Prefill: f.prefillURLs, Decode: f.decodeURLs, Policy: f.policy,
		CacheThreshold: f.cacheThresh, BalanceAbsThreshold: f.balanceAbs, BalanceRelThreshold: f.balanceRel, APIKey: f.apiKey, Metrics: ms, Logger: log, Auth: plane,
		ModelName: name, TokenizerFingerprint: tok.Fingerprint(), MaxQueued: f.maxQueued, QueueTimeout: f.queueTimeout,
		MaxMigrations: zeroIsNever(f.maxMigrations), DisaggPrefillThreshold: zeroIsNever(f.disaggThreshold)})
	if err != nil {
		return err
	}
	defer rt.Close()
	rctx, rstop := context.WithCancel(context.Background())
	defer rstop()
	rt.Start(rctx)
	if err := startPlanner(rctx, f, rt, ms, log); err != nil {
		return err
	}
	// A router told nothing of the model serves the bundled one's name and
	// tokenizer; workers that report another identity are a router started
	// without their --model, which must not come up half-configured.
	if !learned && f.modelPath == "" && f.tokenizerPath == "" && f.servedName == "" {
		if why := rt.IdentityRefusals(); len(why) > 0 && len(why) == len(f.prefillURLs)+len(f.decodeURLs) {
			return fmt.Errorf("the router was started without --model and serves %s, but every worker serves another model or tokenizer; "+
				"give the router the workers' --model (or their --tokenizer and --served-model-name):\n  %s", name, strings.Join(why, "\n  "))
		}
	}
	maxPrompt, maxSeq := rt.Capacity()
	log.Info("router", "model", name, "prefill", f.prefillURLs, "decode", f.decodeURLs, "policy", f.policy,
		"max_prompt_tokens", maxPrompt, "max_sequence_tokens", maxSeq, "ready", rt.Ready())
	srv := server.New(server.Options{
		ModelName: name, APIKey: f.apiKey, PrefixCacheScope: prefixcache.Scope(f.cacheScope), Tokenizer: tok, Template: tmpl, Generator: rt, Metrics: ms, Defaults: defaults,
		Constraints: newConstraints(tok).check, ToolCallParser: f.toolCallParser, ReasoningParser: f.reasoningParser, CORS: f.mustCORS(),
		MetricsRequireKey: f.metricsKey, BodyReadTimeout: f.readTimeout, AllowSpecialTokensInPrompt: f.allowSpecial,
		MaxPromptTokens: func() int { p, _ := rt.Capacity(); return p }, Logger: log,
		MaxModelLen: func() int { _, seq := rt.Capacity(); return seq },
		Info: map[string]any{"role": "router", "model": name, "tokenizer_fingerprint": tok.Fingerprint(), "policy": f.policy,
			"internal_auth": plane.Describe()},
		LiveInfo: func() map[string]any {
			p, s := rt.Capacity()
			return map[string]any{"max_prompt_tokens": p, "effective_context_length": s, "workers": rt.Workers(), "refused_pairs": rt.PairRefusals()}
		},
	})
	// /health follows the router's view: ready while one healthy pair exists
	// and the router is not shutting down.
	var stopping atomic.Bool
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			srv.SetReady(rt.Ready() && !stopping.Load())
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port)))
	if err != nil {
		return err
	}
	// As the workers and standalone do: the port stays open through the
	// drain, new generations are refused and /health says 503 (one step,
	// in Drain, which the ticker's SetReady cannot undo) so that a load
	// balancer stops sending, and the streams already relayed finish.
	drain := func(ctx context.Context) {
		srv.Drain()
		for rt.InFlight() > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return serveHTTP(ctx, f, logw, log, ln, srv, func(ready bool) {
		stopping.Store(!ready)
		srv.SetReady(ready && rt.Ready())
	}, drain)
}

// zeroIsNever is a count flag whose 0 means never (--max-migrations,
// --disagg-prefill-threshold) as router.Options takes it, where 0 means
// the default and never is negative.
func zeroIsNever(flag int) int {
	if flag == 0 {
		return -1
	}
	return flag
}

// learnTokenizer asks the prefill workers for their tokenizer's files (a
// router of its own, probing once, with its own plane and metrics) and
// loads it; dir holds a Hugging Face directory's files for the caller to
// read the generation defaults from and remove.
func learnTokenizer(f *serveFlags, log *slog.Logger) (tok *tokenizer.Tokenizer, name, dir string, err error) {
	ms := metrics.New("router")
	plane, err := f.internal.plane(auth.RoleRouter, log, ms)
	if err != nil {
		return nil, "", "", err
	}
	rt, err := router.New(router.Options{Prefill: f.prefillURLs, Decode: f.decodeURLs, APIKey: f.apiKey, Metrics: ms, Auth: plane})
	if err != nil {
		return nil, "", "", err
	}
	defer rt.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rt.Refresh(ctx)
	tf, err := rt.FetchTokenizer(ctx)
	if err != nil {
		return nil, "", "", err
	}
	tok, dir, err = learnedTokenizer(tf)
	if err != nil {
		return nil, "", "", err
	}
	log.Info("serving the model the prefill workers serve", "model", tf.ServedModel, "tokenizer_fingerprint", tf.TokenizerFingerprint)
	return tok, tf.ServedModel, dir, nil
}

// routerTokenizer loads only the tokenizer (and chat template) of the model:
// from a Hugging Face directory's tokenizer files or a GGUF's metadata.
func routerTokenizer(f *serveFlags) (*tokenizer.Tokenizer, string, error) {
	name := bundled.Name
	if f.modelPath != "" {
		name = model.NameFromPath(f.modelPath)
	}
	path := f.tokenizerPath
	if path == "" {
		path = f.modelPath
	}
	if path == "" {
		gf, err := gguf.Parse(bundled.Stories260K)
		if err != nil {
			return nil, "", err
		}
		tok, err := tokenizer.FromGGUF(gf)
		return tok, name, err
	}
	tok, err := loadTokenizer(path)
	return tok, name, err
}
