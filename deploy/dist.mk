# make dist: the release build, exactly as the container image makes it
# (deploy/docker/Dockerfile runs this file's dist target), so that what the
# image ships can be built and tried without Docker:
#
#   make dist                      # dist/bin/baton and its docs
#   make dist VERSION=1.2.3 GO_TAGS=ucx
#   make image / make image-cuda   # the container images (needs Docker)
#
# Included from the Makefile; `make -f deploy/dist.mk dist` works alone.

GO       ?= go
DIST     ?= dist
# The version `baton version` prints; the image build passes it in, since
# the build context carries no .git.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# ucx adds the UCX transport (needs libucx-dev); the image builds with it.
GO_TAGS  ?=
IMAGE    ?= baton

.PHONY: dist image image-cuda

# -trimpath keeps the build machine's paths out of the binary and its panics;
# -s -w drop the symbol table and DWARF (stack traces keep their names).
# cgo stays on: the CPU kernels are C and link OpenBLAS.
dist:
	rm -rf $(DIST)
	mkdir -p $(DIST)/bin $(DIST)/share/doc/baton
	CGO_ENABLED=1 $(GO) build -trimpath -buildvcs=false -tags '$(GO_TAGS)' \
		-ldflags '-s -w -X main.version=$(VERSION)' -o $(DIST)/bin/baton ./cmd/baton
	cp README.md $(DIST)/share/doc/baton/README.md
	cp internal/bundled/LICENSE.md $(DIST)/share/doc/baton/stories260K-LICENSE.md
	$(DIST)/bin/baton version

image:
	docker build -f deploy/docker/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) -t $(IMAGE):cpu .

image-cuda:
	docker build -f deploy/docker/Dockerfile --build-arg VARIANT=cuda --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION)-cuda -t $(IMAGE):cuda .
