package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/term"

	"github.com/batonlm/baton/internal/gguf"
	"github.com/batonlm/baton/internal/hicache"
	"github.com/batonlm/baton/internal/kernels"
	"github.com/batonlm/baton/internal/kernels/cuda"
	"github.com/batonlm/baton/internal/kernels/device"
	"github.com/batonlm/baton/internal/kvpool"
	"github.com/batonlm/baton/internal/metrics"
	"github.com/batonlm/baton/internal/model"
	"github.com/batonlm/baton/internal/prefixcache"
	"github.com/batonlm/baton/internal/reasoning"
	"github.com/batonlm/baton/internal/router"
	"github.com/batonlm/baton/internal/scheduler"
	"github.com/batonlm/baton/internal/server"
	"github.com/batonlm/baton/internal/tokenizer"
	"github.com/batonlm/baton/internal/tokenizer/chat"
	"github.com/batonlm/baton/internal/toolcall"
	"github.com/batonlm/baton/internal/transfer/ucx"
)

type serveFlags struct {
	// CORS, as vLLM's flags of the same names take it.
	allowedOrigins, allowedMethods, allowedHeaders string
	allowCredentials                               bool

	toolCallParser  string
	reasoningParser string
	role            string
	modelPath       string
	host            string
	port            int
	servedName      string
	tokenizerPath   string
	chatTemplate    string
	contextLength   int
	pageSize        int
	maxTotalTokens  int
	kvCacheMemory   string
	// memFractionStatic (SGLang's) sizes weights and KV together as a
	// fraction of the device's memory; kvBudget is the KV share it leaves.
	memFractionStatic float64
	kvBudget          int64
	chunkedPrefill    int
	maxRunning        int
	maxQueued         int
	queueTimeout      time.Duration
	maxMigrations     int
	disaggThreshold   int
	preemptAfter      time.Duration
	specAlgorithm     string
	specDraftTokens   int
	specSteps         int
	specDraftPath     string
	specDraftFormat   string
	specDisableBatch  int
	apiKey            string
	metricsKey        bool
	readTimeout       time.Duration
	idleTimeout       time.Duration
	maxConns          int
	allowSpecial      bool
	loadFormat        string
	mmapWeights       bool
	dummyDType        string
	kvPoison          bool
	kvCacheDType      string
	cudaGraphMaxBS    int
	noCUDAGraph       bool
	noRadixCache      bool
	decodeRadix       bool
	cacheScope        string
	hicache           hicacheFlags
	strictCapacity    bool
	threads           int
	shutdownTimeout   time.Duration
	drainGrace        time.Duration

	// the speculative decoding guard (standalone, decode)
	specGuard          string
	specGuardMinTokens int
	specGuardMinLength float64
	specGuardMaxRate   float64

	dryRun      bool
	cpuProfile  string
	device      string
	rdmaDevices []string

	// prefill/decode
	advertiseHost  string
	grpcPort       int
	transferPort   int
	transport      string
	ipcArena       string
	ucxKVBuffer    string
	handoffTimeout time.Duration
	maxResPerPeer  int
	maxPagesPeer   peerPages

	// internal plane (router, prefill, decode)
	internal internalFlags
	planner  plannerFlags // router --planner (plan.go)
	tracing  tracingFlags // --otlp-traces-* (tracing.go)

	// router
	prefillURLs []string
	decodeURLs  []string
	policy      string
	cacheThresh float64
	balanceAbs  int
	balanceRel  float64

	// draftKVPerToken is the draft model's KV bytes per token (f32), which
	// the KV budget holds beside the target's.
	draftKVPerToken int
}

func serveCmd() *cobra.Command {
	f := &serveFlags{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run a server role (standalone, prefill, decode or router)",
		Long: `Run a server role. Every flag can also be set by an environment variable
BATON_<FLAG_NAME>, e.g. BATON_PAGE_SIZE=32; the command line wins.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd.Flags()); err != nil {
				return err
			}
			for _, w := range unknownEnv(os.Environ()) {
				fmt.Fprintln(cmd.ErrOrStderr(), "baton: warning: environment variable "+w+"; it is ignored")
			}
			if err := sglangAliases(cmd.Flags(), f); err != nil {
				return err
			}
			if err := flagsForRole(cmd.Flags(), f.role); err != nil {
				return err
			}
			if err := f.validate(); err != nil {
				return err
			}
			if err := f.tracing.validate(); err != nil {
				return err
			}
			if f.dryRun {
				fmt.Fprintf(cmd.OutOrStdout(), "baton: %s configuration is valid\n", f.role)
				return nil
			}
			if f.cpuProfile != "" {
				stop, err := startCPUProfile(f.cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			stopTracing, err := f.tracing.start(f.role)
			if err != nil {
				return err
			}
			defer stopTracing()
			switch f.role {
			case "prefill", "decode":
				return runWorker(cmd.Context(), f, cmd.ErrOrStderr())
			case "router":
				return runRouter(cmd.Context(), f, cmd.ErrOrStderr())
			}
			return runStandalone(cmd.Context(), f, cmd.ErrOrStderr())
		},
	}
	fs := cmd.Flags()
	f.planner.register(fs, true)
	f.tracing.register(fs)
	fs.StringVar(&f.role, "role", "standalone", "standalone | prefill | decode | router")
	fs.StringVar(&f.modelPath, "model", "", "GGUF file, Hugging Face model directory (config.json + safetensors), or a config.json with --load-format dummy; empty: the bundled stories260K")
	fs.StringVar(&f.host, "host", "127.0.0.1", "address to listen on")
	fs.IntVar(&f.port, "port", 8000, "port to listen on (0: any free port)")
	fs.StringVar(&f.tokenizerPath, "tokenizer", "", "take the tokenizer from this GGUF file or Hugging Face directory instead of the model's")
	fs.StringVar(&f.chatTemplate, "chat-template", "", "Jinja chat template file to use instead of the model's")
	fs.StringVar(&f.servedName, "served-model-name", "", "model name clients use (default: the model file's base name)")
	fs.IntVar(&f.contextLength, "context-length", 0, "maximum sequence length (default: the model's)")
	fs.IntVar(&f.pageSize, "page-size", 16, "tokens per KV page")
	fs.IntVar(&f.maxTotalTokens, "max-total-tokens", 0, "KV pool size in tokens (default: derived from --kv-cache-memory)")
	fs.StringVar(&f.kvCacheMemory, "kv-cache-memory", "1GiB", "memory budget for the KV pool when --max-total-tokens is not set")
	fs.Float64Var(&f.memFractionStatic, "mem-fraction-static", 0, "SGLang's sizing instead of --kv-cache-memory: weights plus KV pool take this fraction (0..1) of the device's memory (host RAM on cpu); 0: off")
	fs.IntVar(&f.chunkedPrefill, "chunked-prefill-size", 512, "most prompt tokens prefilled in one step")
	fs.IntVar(&f.maxRunning, "max-running-requests", 64, "most requests in the running batch")
	fs.DurationVar(&f.preemptAfter, "preempt-after", 0, "standalone: a request waiting this long for a full batch takes the slot of the one that generated most, which keeps its pages and resumes later (0: never)")
	fs.StringVar(&f.specAlgorithm, "speculative-algorithm", "", "standalone, decode: speculative decoding: ngram (drafts from the request's own prompt and output, verified by the model in the same forward pass), draft (a smaller model with the same tokenizer, --speculative-draft-model-path); empty: off")
	fs.StringVar(&f.specDraftPath, "speculative-draft-model-path", "", "standalone, decode: the draft model of --speculative-algorithm draft (GGUF file or Hugging Face directory, as --model); it must have the model's tokenizer")
	fs.StringVar(&f.specDraftFormat, "speculative-draft-load-format", "auto", "standalone, decode: auto | gguf | safetensors | dummy, for the draft model")
	fs.IntVar(&f.specDisableBatch, "speculative-disable-by-batch-size", 8, "standalone, decode: no drafting in a step whose running batch holds at least this many requests (a large batch is compute-bound: verifying drafts costs more than they save); 0: never")
	fs.IntVar(&f.specDraftTokens, "speculative-num-draft-tokens", 4, "standalone, decode: most draft tokens verified per request and step")
	fs.IntVar(&f.specSteps, "speculative-num-steps", 4, "standalone, decode: longest draft chain; an ngram draft is one chain, so a step verifies at most the smaller of this and --speculative-num-draft-tokens")
	fs.IntVar(&f.maxQueued, "max-queued-requests", 1024, "most requests waiting for admission (router: for a decode worker with room); more get 429 with Retry-After")
	fs.StringVar(&f.apiKey, "api-key", "", "require this bearer key on every route but /health and /metrics (workers: /server_info and unknown routes)")
	fs.BoolVar(&f.metricsKey, "metrics-require-key", false, "require --api-key on /metrics too (default: /metrics is open to scrapers)")
	fs.StringVar(&f.specGuard, "spec-guard", "on", "standalone, decode: stop a speculating generation whose accept figures say its KV is suspect (finish reason spec_anomaly; the router retries it on another decode worker): on or off")
	fs.IntVar(&f.specGuardMinTokens, "spec-guard-min-tokens", scheduler.DefaultSpecGuard.MinTokens, "standalone, decode: the spec guard judges a generation once it has generated this many tokens")
	fs.Float64Var(&f.specGuardMinLength, "spec-guard-min-accept-length", scheduler.DefaultSpecGuard.MinAcceptLength, "standalone, decode: the spec guard stops a generation drafted by a model whose tokens per verifying step fall below this (not applied to ngram drafts)")
	fs.Float64Var(&f.specGuardMaxRate, "spec-guard-max-accept-rate", scheduler.DefaultSpecGuard.MaxAcceptRate, "standalone, decode: the spec guard stops a generation whose share of accepted draft tokens rises above this (a loop)")
	fs.DurationVar(&f.readTimeout, "request-read-timeout", 60*time.Second, "how long a client may take to send a request body; a slower upload gets 408")
	fs.DurationVar(&f.idleTimeout, "http-idle-timeout", 60*time.Second, "close a keep-alive HTTP connection that has sent no request for this long (0: never)")
	fs.IntVar(&f.maxConns, "max-connections", 4096, "most open HTTP connections; at the bound a new client takes the place of the one idle longest, or waits (0: no bound)")
	fs.BoolVar(&f.allowSpecial, "allow-special-tokens-in-prompt", false, "standalone/router: parse control tokens written in a completions prompt (\"</s>\", \"<|im_start|>\") as those tokens; by default they are text (chat messages always are)")
	fs.StringVar(&f.loadFormat, "load-format", "auto", "auto | gguf | safetensors | dummy (random weights with the model's shape)")
	fs.BoolVar(&f.mmapWeights, "mmap", false, "cpu: serve the weights from the model file's mapping instead of a copy in huge pages (less memory where processes share a file; decode reads them through 4 KiB pages, up to 2x slower)")
	fs.StringVar(&f.dummyDType, "dummy-dtype", "f32", "weight dtype of dummy models: f32 | f16 | bf16 | q8_0 | q4_k | q4_k_m (Q4_K, with attn_v, ffn_down and output in Q6_K)")
	fs.BoolVar(&f.kvPoison, "kv-poison", false, "fill freed KV pages with NaN so reads of unwritten KV show up")
	fs.StringVar(&f.kvCacheDType, "kv-cache-dtype", "auto", "element type of stored KV: auto (f16 on cpu, bf16 on cuda) | f32 | f16 | bf16 | fp8_e4m3 (fp8, cuda only); f16/bf16 halve the KV memory and the handoff bytes, fp8 quarters them; prefill and decode must agree")
	fs.IntVar(&f.cudaGraphMaxBS, "cuda-graph-max-bs", cuda.DefaultGraphMaxBS, "cuda: decode steps of up to this many sequences run as CUDA graphs, one per batch-size bucket (1, 2, 4, 8, then multiples of 8), captured at a bucket's first step")
	fs.BoolVar(&f.noCUDAGraph, "disable-cuda-graph", false, "cuda: launch every decode step's kernels one by one (no CUDA graphs)")
	fs.BoolVar(&f.strictCapacity, "strict-capacity", false, "refuse to start when the context length exceeds the KV pool")
	fs.BoolVar(&f.noRadixCache, "disable-radix-cache", false, "standalone, prefill: turn the prefix cache off (every prompt is computed in full)")
	fs.BoolVar(&f.decodeRadix, "disaggregation-decode-enable-radix-cache", false, "decode: keep finished requests' pages in a prefix cache; a reservation pins the prefix it holds for the tenant and prefill ships only the rest (tcp transport)")
	fs.StringVar(&f.cacheScope, "prefix-cache-scope", "key", "standalone, router: who shares prefix cache pages: key (each API key, split further by cache_salt) | global (all keys; for single-tenant deployments, since a hit is a timing signal)")
	f.hicache.register(fs)
	fs.StringVar(&f.device, "device", "auto", "kernels: cpu | cuda | auto (CUDA when a usable GPU is present, else CPU)")
	fs.StringSliceVar(&f.rdmaDevices, "rdma-device", nil, "ucx transport: restrict UCX to these RDMA devices (e.g. mlx5_0)")
	// SGLang's names for the same settings, so that a command line written
	// for SGLang's PD mode needs no translating. Each writes the variable
	// of baton's flag; sglangAliases refuses both names at once.
	fs.StringVar(&f.role, "disaggregation-mode", "standalone", "SGLang's name for --role: null (standalone) | prefill | decode")
	fs.StringVar(&f.transport, "disaggregation-transfer-backend", "tcp", "SGLang's name for --transport (tcp, ucx, cuda-ipc)")
	fs.StringSliceVar(&f.rdmaDevices, "disaggregation-ib-device", nil, "SGLang's name for --rdma-device")
	fs.IntVar(&f.threads, "threads", 0, "CPU threads for kernels (default: all cores)")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long running requests may finish after SIGTERM")
	fs.BoolVar(&f.dryRun, "dry-run", false, "check the flags and exit without serving")
	_ = fs.MarkHidden("dry-run")
	fs.StringVar(&f.cpuProfile, "cpu-profile", "", "write a Go CPU profile (go tool pprof) of the whole run to this file, finished at shutdown")
	_ = fs.MarkHidden("cpu-profile")
	fs.StringVar(&f.advertiseHost, "advertise-host", "", "prefill/decode: host peers reach this worker at (default: --host; set it to the pod IP when binding 0.0.0.0)")
	fs.IntVar(&f.grpcPort, "grpc-port", 0, "prefill/decode: gRPC control-plane port (0: any free port)")
	fs.IntVar(&f.transferPort, "transfer-port", 0, "decode: KV transport receiver port (0: any free port)")
	fs.StringVar(&f.transport, "transport", "tcp", "prefill/decode: KV transport (tcp, ucx, cuda-ipc)")
	fs.StringVar(&f.ucxKVBuffer, "ucx-kv-buffer", "auto", "decode, --transport ucx with a GPU pool: where prefill's puts land (auto: in the pool itself when UCX can register GPU memory, else host; host: a landing zone in host memory, copied into the pool at Commit)")
	fs.StringVar(&f.ipcArena, "cuda-ipc-arena", "auto", "prefill, --transport cuda-ipc or ucx with a GPU pool: GPU memory staging the pages shipped (auto: an eighth of the KV pool, 8 MiB to 1 GiB)")
	fs.DurationVar(&f.drainGrace, "drain-grace", 10*time.Second, "decode: after SIGTERM or POST /drain, how long running requests may go on before the worker hands them back to the router, which continues each on another pair (0: at once)")
	fs.DurationVar(&f.handoffTimeout, "handoff-timeout", 60*time.Second, "decode: abort a reservation whose commit has not come by then; a writer still holding its session that long after an abort is cut off")
	fs.IntVar(&f.maxResPerPeer, "max-reservations-per-peer", 256, "decode: most reservations one caller may hold at once (0: no bound)")
	f.maxPagesPeer = defaultPeerPages
	fs.Var(&f.maxPagesPeer, "max-pages-per-peer", "decode: most KV pages one caller's reservations may hold at once: a number, or a share of the pool such as 50%, never less than one request of the whole context (0: no bound)")
	f.internal.register(fs)
	fs.StringSliceVar(&f.prefillURLs, "prefill", nil, "router: prefill worker URLs (repeatable or comma separated)")
	fs.StringSliceVar(&f.decodeURLs, "decode", nil, "router: decode worker URLs (repeatable or comma separated)")
	fs.StringVar(&f.policy, "policy", "round_robin", "router: worker selection, round_robin | least_load | cache_aware (the prefill and decode workers likeliest to hold the prompt's prefix for its tenant)")
	fs.Float64Var(&f.cacheThresh, "cache-threshold", router.DefaultCacheThreshold, "router, cache_aware: the share of a prompt's pages a worker must be thought to hold to get it; below it, the worker holding least")
	fs.IntVar(&f.balanceAbs, "balance-abs-threshold", router.DefaultBalanceAbsThreshold, "router, cache_aware: route by load instead when the busiest worker of a role has more than this many requests over the idlest...")
	fs.Float64Var(&f.balanceRel, "balance-rel-threshold", router.DefaultBalanceRelThreshold, "router, cache_aware: ...and more than this many times as many")
	fs.StringVar(&f.toolCallParser, "tool-call-parser", "", "standalone/router: read tool calls out of chat answers: "+strings.Join(toolcall.Formats, " | ")+" (empty: tool_choice auto gets 400; named and required need no parser)")
	fs.StringVar(&f.allowedOrigins, "allowed-origins", `["*"]`, "standalone/router: CORS origins browsers may call from (a JSON list, as vLLM takes it, or a comma list; * for any)")
	fs.StringVar(&f.allowedMethods, "allowed-methods", `["*"]`, "standalone/router: CORS methods a preflight allows")
	fs.StringVar(&f.allowedHeaders, "allowed-headers", `["*"]`, "standalone/router: CORS request headers a preflight allows")
	fs.BoolVar(&f.allowCredentials, "allow-credentials", false, "standalone/router: let browsers send credentials (cookies, Authorization) cross-origin")
	fs.StringVar(&f.reasoningParser, "reasoning-parser", "", "standalone/router: split <think> blocks into reasoning_content: "+strings.Join(reasoning.Formats, " | "))
	fs.DurationVar(&f.queueTimeout, "queue-timeout", time.Minute, "router: how long a request may wait in the queue for a decode worker with room; then 429 with Retry-After")
	fs.IntVar(&f.maxMigrations, "max-migrations", router.DefaultMaxMigrations, "router: most times a request whose decode worker fails after tokens reached the client is continued on another pair from the tokens it has (0: never)")
	fs.IntVar(&f.disaggThreshold, "disagg-prefill-threshold", router.DefaultDisaggPrefillThreshold, "router: compute a prompt on its decode worker, with no handoff, when the part the worker is not thought to cache is at most this many tokens, or it caches most of the prompt (0: hand every prompt over)")
	return cmd
}

// validate checks what can be checked without loading anything.
func (f *serveFlags) validate() error {
	if f.toolCallParser != "" && !toolcall.Valid(f.toolCallParser) {
		return fmt.Errorf("--tool-call-parser %q: not one of %s", f.toolCallParser, strings.Join(toolcall.Formats, ", "))
	}
	if f.reasoningParser != "" && !reasoning.Valid(f.reasoningParser) {
		return fmt.Errorf("--reasoning-parser %q: not one of %s", f.reasoningParser, strings.Join(reasoning.Formats, ", "))
	}
	if _, err := f.cors(); err != nil {
		return err
	}
	switch f.role {
	case "standalone", "prefill", "decode":
	case "router":
		if len(f.prefillURLs) == 0 || len(f.decodeURLs) == 0 {
			return fmt.Errorf("--role router needs at least one --prefill and one --decode URL")
		}
		// New checks the URLs and the policy without contacting any worker.
		rt, err := router.New(router.Options{Prefill: f.prefillURLs, Decode: f.decodeURLs, Policy: f.policy,
			CacheThreshold: f.cacheThresh, BalanceAbsThreshold: f.balanceAbs, BalanceRelThreshold: f.balanceRel})
		if err != nil {
			return err
		}
		rt.Close()
	default:
		return fmt.Errorf("unknown role %q (standalone, prefill, decode, router)", f.role)
	}
	if err := f.internal.check(f.role, f.host); err != nil {
		return err
	}
	switch {
	case f.port < 0 || f.port > 65535 || f.grpcPort < 0 || f.grpcPort > 65535 || f.transferPort < 0 || f.transferPort > 65535:
		return fmt.Errorf("ports must be between 0 and 65535")
	case f.pageSize <= 0:
		return fmt.Errorf("--page-size must be positive")
	case f.chunkedPrefill <= 0 || f.maxRunning <= 0 || f.maxQueued <= 0:
		return fmt.Errorf("--chunked-prefill-size, --max-running-requests and --max-queued-requests must be positive")
	case f.readTimeout <= 0:
		return fmt.Errorf("--request-read-timeout must be positive")
	case f.idleTimeout < 0 || f.maxConns < 0:
		return fmt.Errorf("--http-idle-timeout and --max-connections must not be negative")
	case f.decodeRadix && f.transport == "ucx":
		// A one-sided writer holds the address of every page it was given;
		// held pages are not to be written, which only a receiver that
		// checks each frame can refuse.
		return fmt.Errorf("--disaggregation-decode-enable-radix-cache needs --transport tcp")
	case f.cacheScope != string(prefixcache.ScopeKey) && f.cacheScope != string(prefixcache.ScopeGlobal):
		return fmt.Errorf("unknown --prefix-cache-scope %q (key, global)", f.cacheScope)
	case f.hicache.check(f) != nil:
		return f.hicache.check(f)
	case f.spec().Validate() != nil:
		return fmt.Errorf("--speculative-algorithm: %w", f.spec().Validate())
	case f.specGuard != "on" && f.specGuard != "off":
		return fmt.Errorf("--spec-guard %q: on or off", f.specGuard)
	case f.specGuardConfig().Validate() != nil:
		return fmt.Errorf("--spec-guard-*: %w", f.specGuardConfig().Validate())
	case f.specAlgorithm == "draft" && f.specDraftPath == "":
		return fmt.Errorf("--speculative-algorithm draft needs --speculative-draft-model-path")
	case f.specAlgorithm != "draft" && f.specDraftPath != "":
		return fmt.Errorf("--speculative-draft-model-path is for --speculative-algorithm draft")
	case f.specDisableBatch < 0:
		return fmt.Errorf("--speculative-disable-by-batch-size must not be negative")
	case f.queueTimeout <= 0:
		return fmt.Errorf("--queue-timeout must be positive")
	case f.maxMigrations < 0:
		return fmt.Errorf("--max-migrations must not be negative")
	case f.disaggThreshold < 0:
		return fmt.Errorf("--disagg-prefill-threshold must not be negative")
	case f.cudaGraphMaxBS < 0:
		return fmt.Errorf("--cuda-graph-max-bs must not be negative")
	case f.drainGrace < 0:
		return fmt.Errorf("--drain-grace must not be negative")
	case f.metricsKey && f.apiKey == "":
		return fmt.Errorf("--metrics-require-key needs --api-key")
	case f.transport != "tcp" && f.transport != "ucx" && f.transport != "cuda-ipc":
		return fmt.Errorf("unknown --transport %q (tcp, ucx, cuda-ipc)", f.transport)
	case f.transport == "cuda-ipc" && f.device == "cpu":
		return fmt.Errorf("--transport cuda-ipc moves pages between GPU pools: it needs --device cuda")
	case f.ucxKVBuffer != "auto" && f.ucxKVBuffer != "host":
		return fmt.Errorf("--ucx-kv-buffer %q: auto or host", f.ucxKVBuffer)
	case f.ipcArena != "auto" && f.ipcArenaBytes(0) <= 0:
		return fmt.Errorf("--cuda-ipc-arena %q: auto, or a size such as 256MiB", f.ipcArena)
	case f.transport == "ucx" && !ucx.Enabled:
		return fmt.Errorf("--transport ucx: this binary has no UCX support (build with -tags ucx against libucx-dev)")
	}
	switch f.device {
	case "cpu", "cuda", "auto":
	default:
		return fmt.Errorf("unknown --device %q (cpu, cuda, auto)", f.device)
	}
	if _, err := parseBytes(f.kvCacheMemory); err != nil {
		return fmt.Errorf("--kv-cache-memory: %w", err)
	}
	if f.memFractionStatic < 0 || f.memFractionStatic >= 1 {
		return fmt.Errorf("--mem-fraction-static %g: give a fraction between 0 and 1", f.memFractionStatic)
	}
	if _, err := parseDType(f.dummyDType); err != nil {
		return err
	}
	if _, err := parseKVDType(f.kvCacheDType, nil); err != nil {
		return err
	}
	switch f.loadFormat {
	case "auto", "gguf", "safetensors", "dummy":
	default:
		return fmt.Errorf("unknown --load-format %q (auto, gguf, safetensors, dummy)", f.loadFormat)
	}
	switch f.specDraftFormat {
	case "auto", "gguf", "safetensors", "dummy":
	default:
		return fmt.Errorf("unknown --speculative-draft-load-format %q (auto, gguf, safetensors, dummy)", f.specDraftFormat)
	}
	return nil
}

// parseBytes reads sizes like 512MiB, 2GiB, 1GB or a plain byte count.
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.m
			break
		}
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		return 0, fmt.Errorf("bad size %q (examples: 512MiB, 2GiB)", s)
	}
	return int64(v * float64(mult)), nil
}

// dummyDType is what --dummy-dtype asks for: one dtype for every matrix,
// or (pick set) a quantised file's mix chosen by each matrix's kind.
type dummyDType struct {
	dt   kernels.DType
	pick func(kind string) kernels.DType
}

func (d dummyDType) loadOptions(o model.LoadOptions) model.LoadOptions {
	o.DummyDType, o.DummyPick = d.dt, d.pick
	return o
}

func parseDType(s string) (dummyDType, error) {
	switch strings.ToLower(s) {
	case "f32":
		return dummyDType{dt: kernels.F32}, nil
	case "f16":
		return dummyDType{dt: kernels.F16}, nil
	case "q8_0":
		return dummyDType{dt: kernels.Q8_0}, nil
	case "bf16":
		return dummyDType{dt: kernels.BF16}, nil
	case "q4_k":
		return dummyDType{dt: kernels.Q4_K}, nil
	case "q4_k_m":
		return dummyDType{dt: kernels.Q4_K, pick: model.Q4KM}, nil
	}
	return dummyDType{}, fmt.Errorf("unknown dtype %q (f32, f16, bf16, q8_0, q4_k, q4_k_m)", s)
}

// parseKVDType reads --kv-cache-dtype for a pool on be: auto is the
// backend's choice (kernels.AutoKVDType: f16 on the cpu backend, bf16 on
// cuda), and a dtype be's kernels do not serve is refused here, before
// any request. be may be nil to check the flag alone.
func parseKVDType(s string, be kernels.Backend) (kernels.DType, error) {
	var dt kernels.DType
	switch strings.ToLower(s) {
	case "auto":
		if be == nil {
			return kernels.F32, nil
		}
		return kernels.AutoKVDType(be), nil
	case "f32":
		dt = kernels.F32
	case "f16":
		dt = kernels.F16
	case "bf16":
		dt = kernels.BF16
	case "fp8", "fp8_e4m3":
		dt = kernels.F8E4M3
	default:
		return 0, fmt.Errorf("unknown --kv-cache-dtype %q (auto, f32, f16, bf16, fp8_e4m3)", s)
	}
	if be != nil && !kernels.SupportsKVDType(be, dt) {
		return 0, fmt.Errorf("--kv-cache-dtype %s is not served by the %s backend (use --device cuda, or f16/bf16)", dt, be.Name())
	}
	return dt, nil
}

// samplingDefaults are what a request leaves out, taken from the model's
// generation_config.json as vLLM does (temperature, top_p, top_k, min_p,
// max_new_tokens).
func samplingDefaults(g model.GenerationConfig) server.SamplingDefaults {
	return server.SamplingDefaults{Temperature: g.Temperature, TopP: g.TopP, TopK: g.TopK, MinP: g.MinP, MaxTokens: g.MaxNewTokens}
}

// loadTokenizer reads a tokenizer alone: a Hugging Face directory's
// tokenizer files or a GGUF file's metadata (weights are never paged in).
func loadTokenizer(path string) (*tokenizer.Tokenizer, error) {
	if dir, ok := model.HFDir(path); ok {
		return tokenizer.FromHFDir(dir)
	}
	gf, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	defer gf.Close()
	return tokenizer.FromGGUF(gf)
}

// poolPlan sizes the KV pool and the effective context length.
type poolPlan struct {
	pages, pageSize       int
	modelContext, context int
	lowered               bool
}

func kvElemBytes(d kernels.DType) int { return kernels.PagedKV{DType: d}.ElemBytes() }

// planPool sizes the pool for KV stored as kvdt.
func planPool(f *serveFlags, c *model.Config, kvdt kernels.DType) (poolPlan, error) {
	p := poolPlan{pageSize: f.pageSize, modelContext: c.ContextLength}
	if f.pageSize <= 0 {
		return p, fmt.Errorf("--page-size must be positive")
	}
	if f.contextLength > 0 {
		p.modelContext = f.contextLength
	}
	tokens := f.maxTotalTokens
	if tokens <= 0 {
		budget, err := parseBytes(f.kvCacheMemory)
		if err != nil {
			return p, fmt.Errorf("--kv-cache-memory: %w", err)
		}
		if f.memFractionStatic > 0 {
			budget = f.kvBudget
		}
		// Pages of f16/bf16 KV take half the bytes, so a budget holds twice
		// the tokens.
		tokens = int(budget / int64((c.KVBytesPerToken()+f.draftKVPerToken)/4*kvElemBytes(kvdt)))
		// A pool larger than every running request at full context is memory
		// nobody can use.
		tokens = min(tokens, p.modelContext*max(1, f.maxRunning))
	}
	p.pages = tokens / f.pageSize
	if p.pages < 1 {
		return p, fmt.Errorf("KV pool of %d tokens holds not even one page of %d", tokens, f.pageSize)
	}
	p.context = p.modelContext
	if capTokens := p.pages * f.pageSize; capTokens < p.context {
		if f.strictCapacity {
			return p, fmt.Errorf("context length %d exceeds the KV pool's %d tokens (--strict-capacity)", p.context, capTokens)
		}
		p.context, p.lowered = capTokens, true
	}
	return p, nil
}

// loadedEngine is what every model-holding role starts from: weights,
// tokenizer, a sized KV pool and the start-up summary already logged.
type loadedEngine struct {
	loaded  *model.Loaded
	tok     *tokenizer.Tokenizer
	plan    poolPlan
	pool    *kvpool.Pool
	name    string
	log     *slog.Logger
	backend kernels.Backend
	// devKV is the pool's memory when the backend holds it (a GPU's).
	devKV kernels.DeviceKV
	// region is memory UCX allocated for a decode worker (ucx transport):
	// the pool itself, or landing when the pool is in GPU memory; freed
	// last, after the receiver and the engine stopped.
	region  *ucx.Region
	landing kernels.PagedKV
	// ucxDevice registers a GPU pool with UCX in place (decode, ucx,
	// ucxDeviceMemory): nil when the pages land in host memory.
	ucxDevice ucx.Option
	// transferPath is /server_info's kv_transfer_path.
	transferPath string
	// constraints compiles structured-output constraints for the engine.
	constraints *constraints
	// draftModel is the draft of --speculative-algorithm draft, draft its
	// pool, draftKV the pool's memory when the backend holds it.
	draftModel *model.Model
	draft      *scheduler.DraftModel
	draftKV    kernels.DeviceKV
}

func loadEngine(f *serveFlags, logw io.Writer) (*loadedEngine, error) {
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelInfo})).With("role", f.role)
	dt, err := parseDType(f.dummyDType)
	if err != nil {
		return nil, err
	}
	be, line, err := device.Select(f.device, f.threads)
	if err != nil {
		return nil, err
	}
	log.Info("kernels", "device", line)
	if g, ok := be.(interface{ SetGraphs(int, *slog.Logger) }); ok {
		maxBS := f.cudaGraphMaxBS
		if f.noCUDAGraph {
			maxBS = 0
		}
		g.SetGraphs(maxBS, log)
	}
	var progress func(done, total int)
	if fd, ok := logw.(*os.File); ok && term.IsTerminal(int(fd.Fd())) {
		var bar *progressbar.ProgressBar
		progress = func(done, total int) {
			if bar == nil {
				bar = progressbar.NewOptions(total, progressbar.OptionSetWriter(logw), progressbar.OptionSetDescription("loading weights"), progressbar.OptionClearOnFinish())
			}
			_ = bar.Set(done)
		}
	}
	loaded, err := model.Load(dt.loadOptions(model.LoadOptions{Path: f.modelPath, Format: f.loadFormat, Progress: progress, HostCopy: f.hostCopy(be)}), be)
	if err != nil {
		return nil, err
	}
	var tok *tokenizer.Tokenizer
	switch {
	case f.tokenizerPath != "":
		tok, err = loadTokenizer(f.tokenizerPath)
	case loaded.Dir != "":
		tok, err = tokenizer.FromHFDir(loaded.Dir)
	default:
		tok, err = tokenizer.FromGGUF(loaded.GGUF)
	}
	if err != nil {
		loaded.Model.Close()
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	c := &loaded.Model.Config
	draft, err := loadDraft(f, be, loaded.Model, tok, dt)
	if err != nil {
		loaded.Model.Close()
		return nil, err
	}
	closeAll := func() {
		loaded.Model.Close()
		if draft != nil {
			draft.Close()
		}
	}
	weights := loaded.Model.Weights.Bytes()
	if draft != nil {
		weights += draft.Weights.Bytes()
		f.draftKVPerToken = draft.Config.KVBytesPerToken()
	}
	if f.memFractionStatic > 0 {
		if f.kvBudget, err = staticKVBudget(f.memFractionStatic, be, weights); err != nil {
			closeAll()
			return nil, err
		}
	}
	kvdt, err := parseKVDType(f.kvCacheDType, be)
	if err != nil {
		closeAll()
		return nil, err
	}
	plan, err := planPool(f, c, kvdt)
	if err != nil {
		closeAll()
		return nil, err
	}
	name := f.servedName
	if name == "" {
		name = loaded.Name
	}
	le := &loadedEngine{loaded: loaded, tok: tok, plan: plan, name: name, log: log, backend: be, constraints: newConstraints(tok), draftModel: draft}
	fail := func(err error) (*loadedEngine, error) {
		le.close()
		return nil, err
	}
	layout := kernels.PagedKV{PageSize: plan.pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, DType: kvdt}
	pc := kvpool.Config{NumPages: plan.pages, PageSize: plan.pageSize, Layers: c.Layers, KVHeads: c.KVHeads, HeadDim: c.HeadDim, KVDType: kvdt, Poison: f.kvPoison, Guards: guards.pool}
	where := "host"
	if a, ok := be.(kernels.KVAllocator); ok {
		// The backend's kernels read the pool in its own memory (a GPU's).
		dev, err := a.AllocKV(layout, plan.pages)
		if err != nil {
			return fail(fmt.Errorf("KV pool of %d pages: %w", plan.pages, err))
		}
		le.devKV, pc.Device, where = dev, dev, be.Name()
	}
	if f.role == "decode" && f.transport == "ucx" && pc.Device != nil && f.ucxKVBuffer == "auto" {
		if opt, memory := ucxDeviceMemory(f, pc.Device); opt != nil {
			le.ucxDevice = opt
			where += ", registered with ucx as " + memory
		}
	}
	if f.role == "decode" && f.transport == "ucx" && le.ucxDevice == nil {
		// Memory UCX allocates is memory a local prefill writes with its own
		// stores: one-sided for real (see internal/transfer/ucx). A pool in
		// GPU memory UCX cannot register gets it as a landing zone of the
		// same pages, verified and copied into the pool at Commit.
		region, err := ucx.AllocKV(plan.pages*layout.PageFloats(), ucxOptions(f)...)
		if err != nil {
			return fail(err)
		}
		le.region = region
		if pc.Device == nil {
			pc.Data = region.Floats()
		} else {
			le.landing = layout
			le.landing.Data = region.Floats()
			where += ", ucx landing zone in host memory"
		}
	}
	pool, err := kvpool.New(pc)
	if err != nil {
		return fail(err)
	}
	le.pool = pool
	le.transferPath = transferPath(f, pc.Device != nil, le.ucxDevice != nil, hostVisible(pc.Device), log)
	if draft != nil {
		if err := le.draftPool(kvdt, f.kvPoison); err != nil {
			return fail(err)
		}
	}
	weightsAt := "file mapping"
	if loaded.Copied {
		weightsAt = "copy in huge pages"
	} else if f.hostCopy(be) {
		weightsAt = "file mapping (no room for a copy)"
	}
	log.Info("model", "name", name, "arch", c.Arch, "params", loaded.Model.Weights.Params(), "weights", loaded.Model.Weights.DType().String(),
		"weights_memory", weightsAt, "layers", c.Layers, "heads", c.Heads, "kv_heads", c.KVHeads, "vocab", c.Vocab, "backend", be.Name())
	log.Info("kv pool", "pages", plan.pages, "page_size", plan.pageSize, "capacity_tokens", plan.pages*plan.pageSize,
		"bytes", int64(plan.pages)*int64(pool.PageBytes()), "dtype", kvdt.String(), "memory", where, "context_length", plan.modelContext, "poison", f.kvPoison)
	if plan.lowered {
		log.Warn("context length exceeds the KV pool; lowering the effective maximum to the pool",
			"context_length", plan.modelContext, "pool_tokens", plan.pages*plan.pageSize, "effective_max", plan.context)
	}
	return le, nil
}

// close releases the weights' mapping, the pool's device memory, the
// backend's and the pool's UCX memory.
func (le *loadedEngine) close() {
	le.loaded.Model.Close()
	if le.draftModel != nil {
		le.draftModel.Close()
	}
	if le.draftKV != nil {
		_ = le.draftKV.Close()
	}
	if le.devKV != nil {
		_ = le.devKV.Close()
	}
	if c, ok := le.backend.(io.Closer); ok {
		_ = c.Close()
	}
	if le.region != nil {
		_ = le.region.Free()
	}
}

// transferKV is the memory a one-sided transport writes into: the landing
// zone when the pool is out of its reach, else the pool.
func (le *loadedEngine) transferKV() kernels.PagedKV {
	if le.landing.Data != nil {
		return le.landing
	}
	return le.pool.KV()
}

func (le *loadedEngine) engine(f *serveFlags, role scheduler.Role, ms *metrics.Set, cache *prefixcache.Cache, tiers *hicache.Tiers) *scheduler.Engine {
	return scheduler.NewEngine(le.loaded.Model, le.pool, scheduler.Config{
		Role: role, ContextLength: le.plan.context, MaxRunning: f.maxRunning, ChunkSize: f.chunkedPrefill, MaxQueue: f.maxQueued, IsEOG: le.tok.IsEOG,
		Constrain:    le.constraints.matcher,
		PreemptAfter: f.preemptAfter,
		Spec:         le.spec(f, role),
		SpecGuard:    f.specGuardConfig(),
		PrefixCache:  cache,
		Tiers:        tiers,
		Guards:       guards.engine,
		Faults:       engineFaults(le.pool, le.loaded.Model.Config.Vocab, cache),
	}, ms)
}

// fingerprint names the model whose KV the prefix cache keeps: pages
// computed by other weights or another configuration never match.
func (le *loadedEngine) fingerprint(f *serveFlags) string {
	return fmt.Sprintf("%s|%s|%s|%s|%+v", le.name, f.modelPath, f.loadFormat, f.dummyDType, le.loaded.Model.Config)
}

// chatTemplate is --chat-template when given, else the model's own template,
// else the plain fallback.
func chatTemplate(f *serveFlags, tok *tokenizer.Tokenizer, log *slog.Logger) (*chat.Template, error) {
	bos, eos := tok.TokenText(tok.BOS()), tok.TokenText(tok.EOS())
	if f.chatTemplate != "" {
		src, err := os.ReadFile(f.chatTemplate)
		if err != nil {
			return nil, fmt.Errorf("--chat-template: %w", err)
		}
		t, err := chat.New(string(src), bos, eos)
		if err != nil {
			return nil, fmt.Errorf("--chat-template %s: %w", f.chatTemplate, err)
		}
		return t, nil
	}
	if src := tok.ChatTemplate(); src != "" {
		t, err := chat.New(src, bos, eos)
		if err == nil {
			return t, nil
		}
		log.Warn("the model's chat template does not parse; using the plain fallback", "err", err)
	}
	return chat.Plain(), nil
}

func runStandalone(ctx context.Context, f *serveFlags, logw io.Writer) error {
	le, err := loadEngine(f, logw)
	if err != nil {
		return err
	}
	defer le.close()
	tmpl, err := chatTemplate(f, le.tok, le.log)
	if err != nil {
		return err
	}
	ms := metrics.ForModel("standalone", le.name)
	var cache *prefixcache.Cache
	if !f.noRadixCache {
		cache = prefixcache.New(le.pool, le.fingerprint(f), guards.cache)
	}
	tiers, closeTiers, err := le.tiers(f, cache, ms)
	if err != nil {
		return err
	}
	defer closeTiers()
	eng := le.engine(f, scheduler.RoleStandalone, ms, cache, tiers)
	cacheInfo := func() map[string]any {
		if cache == nil {
			return map[string]any{"enabled": false}
		}
		cs, st := cache.Stats(), le.pool.Stats()
		return map[string]any{"enabled": true, "scope": f.cacheScope, "pages": cs.Pages, "pages_cached": st.Cached,
			"queried_tokens": cs.QueriedTokens, "hit_tokens": cs.HitTokens, "hit_rate": cs.HitRate(), "evictions": st.Evictions}
	}
	srv := server.New(server.Options{
		PrefixCacheScope: prefixcache.Scope(f.cacheScope),
		ModelName:        le.name, APIKey: f.apiKey, Tokenizer: le.tok, Template: tmpl, Generator: server.EngineGenerator{Engine: eng},
		Constraints: le.constraints.check, ToolCallParser: f.toolCallParser, ReasoningParser: f.reasoningParser, CORS: f.mustCORS(),
		Defaults: samplingDefaults(le.loaded.Generation), MetricsRequireKey: f.metricsKey, BodyReadTimeout: f.readTimeout, AllowSpecialTokensInPrompt: f.allowSpecial,
		MaxPromptTokens: func() int { return le.plan.context - 1 }, Logger: le.log,
		MaxModelLen: func() int { return le.plan.context },
		Metrics:     ms, Info: map[string]any{"role": "standalone", "context_length": le.plan.modelContext, "effective_context_length": le.plan.context,
			"kv_pool_tokens": le.plan.pages * le.plan.pageSize, "kv_pool_pages": le.plan.pages, "page_size": le.plan.pageSize, "model": le.name,
			"kv_cache_dtype": le.pool.KV().DType.String()},
		LiveInfo: func() map[string]any {
			st := le.pool.Stats()
			return map[string]any{"kv_pages_free": st.Free, "kv_pages_quarantined": st.Quarantined, "kv_pages_cached": st.Cached,
				"prefix_cache": cacheInfo()}
		},
	})
	ln, err := net.Listen("tcp", net.JoinHostPort(f.host, strconv.Itoa(f.port)))
	if err != nil {
		return err
	}
	engCtx, engStop := context.WithCancel(context.Background())
	engDone := make(chan struct{})
	go func() { eng.Run(engCtx); close(engDone) }()
	defer func() { engStop(); <-engDone }()
	// As the workers do: the port stays open through the drain, new work
	// is refused and /health says 503 (one step, in Drain) so that a load
	// balancer stops sending, and what is running finishes.
	drain := func(ctx context.Context) {
		srv.Drain()
		for {
			if running, queued := eng.Load(); running+queued == 0 {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	return serveHTTP(ctx, f, logw, le.log, ln, srv, srv.SetReady, drain)
}

// serveHTTP serves h on ln until SIGINT/SIGTERM. Then it runs drain, which
// must refuse new work and only then report not ready (/health 503), before
// it waits for the work already taken to end: the other order lets a
// request sent on the 503's heels be taken. It then stops the HTTP server
// once its running requests finished — all within --shutdown-timeout; what
// is left after it is aborted by the caller. Without a drain it reports not
// ready itself.
func serveHTTP(ctx context.Context, f *serveFlags, logw io.Writer, log *slog.Logger, ln net.Listener, h http.Handler, setReady func(bool), drain func(context.Context)) error {
	ctx, stop := signal.NotifyContext(ctxOrBackground(ctx), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	hs, ln := server.NewHTTPServer(h, ln, server.HTTPLimits{IdleTimeout: f.idleTimeout, MaxConnections: f.maxConns, BodyReadTimeout: f.readTimeout})
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	setReady(true)
	fmt.Fprintf(logw, "baton: listening on http://%s\n", ln.Addr())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing running requests", "timeout", f.shutdownTimeout)
	sctx, cancel := context.WithTimeout(context.Background(), f.shutdownTimeout)
	defer cancel()
	if drain != nil {
		drain(sctx)
	}
	setReady(false)
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if sctx.Err() != nil {
		log.Warn("shutdown timeout reached; aborting what is still running")
	}
	return nil
}

func ctxOrBackground(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return ctx
}

// ucxOptions are the UCX settings from the flags.
func ucxOptions(f *serveFlags) []ucx.Option {
	return []ucx.Option{ucx.WithRDMADevices(f.rdmaDevices...)}
}

// sglangNames maps each SGLang flag serve accepts to baton's own.
var sglangNames = [][2]string{
	{"disaggregation-mode", "role"},
	{"disaggregation-transfer-backend", "transport"},
	{"disaggregation-ib-device", "rdma-device"},
}

// sglangAliases checks the SGLang names after parsing: a setting given
// under both names is refused rather than settled by flag order, and
// --disaggregation-mode takes only SGLang's values, "null" being SGLang's
// word for a server without disaggregation.
func sglangAliases(fs *pflag.FlagSet, f *serveFlags) error {
	for _, n := range sglangNames {
		if fs.Changed(n[0]) && fs.Changed(n[1]) {
			return fmt.Errorf("--%s is SGLang's name for --%s: give one of them", n[0], n[1])
		}
	}
	if fs.Changed("mem-fraction-static") && fs.Changed("kv-cache-memory") {
		return fmt.Errorf("--mem-fraction-static and --kv-cache-memory both size the KV pool: give one of them")
	}
	if fs.Changed("disaggregation-mode") {
		switch f.role {
		case "null":
			f.role = "standalone"
		case "prefill", "decode":
		default:
			return fmt.Errorf("unknown --disaggregation-mode %q (null, prefill, decode; the router is --role router)", f.role)
		}
	}
	return nil
}

// spec is the engine's speculative decoding setting from the flags.
func (f *serveFlags) spec() scheduler.SpecConfig {
	return scheduler.SpecConfig{Algorithm: f.specAlgorithm, DraftTokens: f.specDraftTokens, Steps: f.specSteps, DisableBatch: f.specDisableBatch}
}

// specGuardConfig is the speculative decoding guard from the flags.
func (f *serveFlags) specGuardConfig() scheduler.SpecGuard {
	return scheduler.SpecGuard{On: f.specGuard == "on", MinTokens: f.specGuardMinTokens,
		MinAcceptLength: f.specGuardMinLength, MaxAcceptRate: f.specGuardMaxRate}
}

// startCPUProfile profiles the process until the returned stop is called
// (at a clean shutdown), for finding where a serving run spends its time.
func startCPUProfile(path string) (func(), error) {
	out, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		out.Close()
	}, nil
}

// hostCopy: the CPU backend multiplies weights copied into huge pages
// (model.LoadOptions.HostCopy) unless --mmap; other backends upload them.
func (f *serveFlags) hostCopy(be kernels.Backend) bool {
	return be.Name() == "cpu" && !f.mmapWeights
}

// ipcArenaBytes is the size of a prefill worker's staging arena
// (cuda-ipc's, or ucx's with a GPU pool) for a pool of poolBytes: what --cuda-ipc-arena says, or auto's eighth of the
// pool, enough for the prompts in flight, within [8 MiB, 1 GiB]. 0: no
// valid size.
func (f *serveFlags) ipcArenaBytes(poolBytes int64) int64 {
	if f.ipcArena == "auto" {
		return min(max(poolBytes/8, 8<<20), 1<<30)
	}
	n, err := parseBytes(f.ipcArena)
	if err != nil {
		return 0
	}
	return n
}

// ipcArena makes a prefill worker's cuda-ipc arena in its pool's GPU
// memory.
func (le *loadedEngine) ipcArena(f *serveFlags) (kernels.Arena, error) {
	exp, ok := le.devKV.(kernels.PeerExporter)
	if !ok {
		return nil, fmt.Errorf("--transport cuda-ipc needs the KV pool in GPU memory (--device cuda); it is on %s", le.backend.Name())
	}
	size := f.ipcArenaBytes(int64(le.pool.NumPages()) * int64(le.pool.PageBytes()))
	a, err := exp.NewArena(int(size))
	if err != nil {
		return nil, fmt.Errorf("--transport cuda-ipc: arena of %d MiB: %w", size>>20, err)
	}
	return a, nil
}

// ucxStagedPath is /server_info's kv_transfer_path for a ucx prefill
// worker that stages in a GPU arena (ucxArena).
const ucxStagedPath = "from the GPU arena (ucx: prefill stages the pages in GPU memory and puts them from there; into a decode pool in host memory, or one UCX cannot register, they go from host memory)"

// ucxArena makes a ucx prefill worker's staging arena in its pool's GPU
// memory, sized as --cuda-ipc-arena says, when UCX can put from it: the
// arena is host memory (the emulated driver) or this UCX build moves
// CUDA memory. nil otherwise (no GPU pool, no arena to be had, a UCX
// without CUDA): the pages then go from host memory as before.
func (le *loadedEngine) ucxArena(f *serveFlags) kernels.Arena {
	exp, ok := le.devKV.(kernels.PeerExporter)
	if !ok {
		return nil
	}
	size := f.ipcArenaBytes(int64(le.pool.NumPages()) * int64(le.pool.PageBytes()))
	a, err := exp.NewArena(int(size))
	if err != nil {
		le.log.Warn("ucx: no GPU staging arena; KV pages go from host memory", "bytes", size, "err", err)
		return nil
	}
	dr, ok := a.(kernels.DeviceRange)
	if !ok {
		_ = a.Close()
		return nil
	}
	if ok, _ := ucxReaches(f, dr); !ok {
		_ = a.Close()
		le.log.Warn("ucx has no CUDA support in this build: KV pages go from host memory, not a GPU arena")
		return nil
	}
	return a
}

// ipcImporter is a decode worker's pool as cuda-ipc copies into it.
func (le *loadedEngine) ipcImporter() (kernels.PeerImporter, error) {
	imp, ok := le.devKV.(kernels.PeerImporter)
	if !ok {
		return nil, fmt.Errorf("--transport cuda-ipc needs the KV pool in GPU memory (--device cuda); it is on %s", le.backend.Name())
	}
	return imp, nil
}

// hostVisible says dev's memory is host memory of this process (the
// emulated driver's), which UCX registers as such.
func hostVisible(dev kernels.DeviceKV) bool {
	dr, ok := dev.(kernels.DeviceRange)
	if !ok {
		return false
	}
	_, _, visible := dr.Range()
	return visible
}

// ucxDeviceMemory is how a decode worker's pool in GPU memory is
// registered with UCX in place, so that prefill puts pages straight into
// it, and what it is registered as; nil when UCX cannot reach it (the
// pages then land in host memory and are copied in at Commit). A UCX
// built with CUDA support registers it as CUDA memory (GPUDirect RDMA on
// InfiniBand, cuda_ipc on one node); the emulated driver's device memory
// is host memory and is registered as such.
func ucxDeviceMemory(f *serveFlags, dev kernels.DeviceKV) (ucx.Option, string) {
	dr, ok := dev.(kernels.DeviceRange)
	if !ok {
		return nil, ""
	}
	ok, asCUDA := ucxReaches(f, dr)
	if !ok {
		return nil, ""
	}
	addr, n, _ := dr.Range()
	if !asCUDA {
		return ucx.WithDeviceMemory(addr, n, false), "host memory (emulated device memory)"
	}
	return ucx.WithDeviceMemory(addr, n, true), "CUDA memory"
}

// ucxReaches says whether UCX can register the device memory dr names,
// and whether as CUDA memory: the emulated driver's is host memory, which
// any UCX registers; a GPU's only a UCX with CUDA support does. Decode's
// pool and prefill's arena are both decided here.
func ucxReaches(f *serveFlags, dr kernels.DeviceRange) (ok, asCUDA bool) {
	if _, _, hostVisible := dr.Range(); hostVisible {
		return true, false
	}
	cuda, err := ucx.CUDAMemory(ucxOptions(f)...)
	return err == nil && cuda, true
}

// transferPath says which memory a worker's KV pages pass through on the
// way between prefill and decode (/server_info's kv_transfer_path). For
// ucx with a GPU pool that is not registered in place it asks UCX whether
// it can register GPU memory at all, and logs once when it cannot;
// emulated says the pool is the emulated driver's host memory.
func transferPath(f *serveFlags, onGPU, ucxDevice, emulated bool, log *slog.Logger) string {
	switch {
	case f.role != "prefill" && f.role != "decode":
		return ""
	case f.transport == "cuda-ipc":
		return "GPU to GPU: prefill stages the pages in its arena and decode copies them into its pool (through the socket when the arena is full)"
	case !onGPU:
		return "host memory (" + f.transport + ")"
	case ucxDevice:
		return "into the GPU pool (ucx: the pool is registered with UCX and prefill puts pages straight into it)"
	case f.transport == "ucx":
		// A decode worker here lands pages in host memory; a prefill
		// worker puts from host memory unless it gets a GPU arena
		// (ucxArena, which then says so).
		if f.role == "decode" && f.ucxKVBuffer == "host" {
			return "GPU pool through host memory (ucx, --ucx-kv-buffer host)"
		}
		if emulated {
			return "GPU pool through host memory (ucx)"
		}
		if cuda, err := ucx.CUDAMemory(ucxOptions(f)...); err == nil && cuda {
			return "GPU pool through host memory (ucx)"
		}
		log.Warn("ucx cannot register GPU memory in this build (no CUDA support: no cuda_copy, cuda_ipc or gdr_copy): KV pages go through host memory between the GPU pool and the network")
		return "GPU pool through host memory (ucx without CUDA support)"
	}
	return "GPU pool through pinned host memory and the socket (tcp)"
}
