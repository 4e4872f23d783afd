GO      ?= go
BIN     := bin/baton
PKGS    := ./...
PORT    ?= 8000

.PHONY: build run run-standalone test chaos bench lint proto clean

build:
	$(GO) build -o $(BIN) ./cmd/baton

run: build
	PORT=$(PORT) ./deploy/local/pd.sh

run-standalone: build
	@echo "try: curl -s http://127.0.0.1:$(PORT)/v1/completions -H 'Content-Type: application/json' -d '{\"model\":\"stories260K\",\"prompt\":\"Once upon a time\",\"max_tokens\":64}'"
	./$(BIN) serve --role standalone --host 127.0.0.1 --port $(PORT) --kv-poison

test: build
	$(GO) vet $(PKGS)
	$(GO) test -count=1 -timeout 15m $(PKGS)

chaos: build
	BATON_CHAOS_REQUESTS=1000 $(GO) test -count=1 -run TestChaos -v ./test/gates

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2x ./internal/kernels/... ./internal/model/...

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet $(PKGS)
	$(GO) run honnef.co/go/tools/cmd/staticcheck@v0.8.2 $(PKGS)

clean:
	rm -rf bin

proto:
	protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative api/pd/v1/pd.proto

include deploy/dist.mk
include kernels.mk
