GO      ?= go
BIN     := bin/baton
PKGS    := ./...
PORT    ?= 8000

.PHONY: build run run-standalone test test-ucx bench-ucx chaos bench bench-prefix bench-hicache bench-spec bench-spec-echo bench-peer bench-models bench-profile host-ceiling lint proto clean deps-run deps-test

# What the machine needs beyond Go: installed from Debian's packages when
# run as root, else the command to run is printed (deploy/local/deps.sh).
deps-run:
	@GO=$(GO) ./deploy/local/deps.sh run

deps-test:
	@GO=$(GO) ./deploy/local/deps.sh test

build:
	$(GO) build -ldflags '$(VERSION_LDFLAGS)' -o $(BIN) ./cmd/baton

# exec: a SIGTERM to make reaches pd.sh itself, which stops the servers;
# through a shell in between it was lost and they outlived make.
run: deps-run build
	PORT=$(PORT) exec ./deploy/local/pd.sh

run-standalone: build
	@echo "try: curl -s http://127.0.0.1:$(PORT)/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":64}'"
	./$(BIN) serve --role standalone --host 127.0.0.1 --port $(PORT) --kv-poison

test: deps-test build
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 15m $(PKGS)
	$(GO) test -race -count=1 -timeout 5m ./internal/roles/ ./internal/handoff/ ./internal/kvpool/ ./internal/auth/ ./internal/transfer/tcp/
	$(MAKE) test-ucx

# The UCX transport (build tag ucx, Debian libucx-dev): the transport and
# handoff tests over shared memory and over UCX's tcp, and PD end to end (the other
# transports do not depend on the tag and run in `test`).
test-ucx:
	$(GO) vet -tags ucx $(PKGS)
	UCX_TLS=posix,cma,self $(GO) test -tags ucx -count=1 -timeout 5m ./internal/transfer/ucx/... ./internal/roles/...
	UCX_TLS=tcp UCX_NET_DEVICES=lo $(GO) test -tags ucx -count=1 -timeout 5m ./internal/transfer/ucx/... ./internal/roles/...
	UCX_TLS=posix,cma,self $(GO) test -tags ucx -count=1 -timeout 5m -run 'UCX' ./test/e2e/

bench-ucx:
	$(GO) test -tags ucx -run '^$$' -bench BenchmarkHandoff -benchtime 20x ./internal/transfer/ucx

chaos: build
	BATON_CHAOS_REQUESTS=1000 $(GO) test -count=1 -run TestChaos -v ./test/gates

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2x ./internal/kernels/... ./internal/model/...
	$(GO) test -run '^$$' -bench 'Mask|CompileCold' -benchtime 2x ./internal/grammar/

# The prefix cache on SGLang's generated-shared-prefix workload, with and without the cache.
bench-prefix:
	$(GO) test -run '^$$' -bench SharedPrefix -benchtime 1x ./test/e2e/

bench-hicache:
	$(GO) test -run '^$$' -bench HiCache -benchtime 1x -timeout 30m ./test/e2e/

# Speculative decoding: 1 stream on a repeating prompt, and 1/8/16/32 streams
# with speculation off, ngram, ngram backing off, and a draft model.
bench-spec:
	$(GO) test -run '^$$' -bench 'SpecDecode|SpecStreams' -benchtime 1x ./internal/scheduler/

# ngram speculation on `bench serve --echo` against models whose weights are
# constructed to copy their input (internal/model/copymodel): 134M at 1 and
# 32 streams, TinyLlama 1.1B's shape at 1; writes the models (0.5 and 2.2 GB)
# under $$TMPDIR once.
bench-spec-echo:
	$(GO) test -run '^$$' -bench SpecEcho -benchtime 1x -timeout 60m ./test/e2e/

# baton next to llama.cpp's llama-server on one GGUF (deploy/bench/peer.sh):
#   make bench-peer LLAMA_SERVER=/path/to/llama-server MODEL=model.gguf [THREADS=2] [STREAMS="1 8 32"] [ROUNDS=1]
#   (LLAMA_ARGS / BATON_ARGS in the environment add flags to either server)
LLAMA_SERVER ?=
MODEL ?=
THREADS ?= $(shell nproc)
STREAMS ?= 1 8 32
ROUNDS ?= 1
bench-peer: build
	./deploy/bench/peer.sh -t $(THREADS) -s "$(STREAMS)" -r $(ROUNDS) $(LLAMA_SERVER) $(MODEL)

# the random-weight GGUFs bench-peer's tables use (deploy/bench/models.sh, baton model synth):
#   make bench-models DIR=/path/to/models [LLAMA_QUANTIZE=/path/to/llama-quantize]   (Q8_0, Q4_K_M too)
DIR ?=
LLAMA_QUANTIZE ?=
bench-models: build
	@test -n "$(DIR)" || { echo "usage: make bench-models DIR=/path/to/models [LLAMA_QUANTIZE=/path/to/llama-quantize]" >&2; exit 2; }
	./deploy/bench/models.sh $(if $(LLAMA_QUANTIZE),-q $(LLAMA_QUANTIZE)) $(DIR)

# where a standalone baton's CPU time goes while serving (deploy/bench/profile.sh, needs perf):
#   make bench-profile MODEL=model.gguf [THREADS=2] [STREAMS=32]   (the last of STREAMS)
bench-profile: build
	./deploy/bench/profile.sh -t $(THREADS) -s $(lastword $(STREAMS)) $(MODEL)

# the host's side of serving on the cuda backend, without a GPU: the binary on
# the emulated driver with its kernels made no-ops (test/gpu/host-ceiling.sh)
host-ceiling: build
	./test/gpu/host-ceiling.sh

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet $(PKGS)
	$(GO) vet -tags ucx $(PKGS)
	$(GO) vet -tags faults $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 -tags ucx $(PKGS)

clean:
	rm -rf bin

proto:
	protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative api/pd/v1/pd.proto

include deploy/dist.mk
include kernels.mk
