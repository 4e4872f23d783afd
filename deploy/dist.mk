# make dist: the release build, exactly as the container image makes it
# (deploy/docker/Dockerfile runs this file's dist target), so that what the
# image ships can be built and tried without Docker:
#
#   make dist                      # dist/bin/baton and its docs
#   make dist VERSION=1.2.3 GO_TAGS=ucx
#   make image / make image-cuda   # the container images (needs Docker)
#   make release VERSION=v0.1.0    # tag a release (see CHANGELOG.md)
#
# Included from the Makefile; `make -f deploy/dist.mk dist` works alone.

GO       ?= go
DIST     ?= dist
# The version `baton version` prints; the image build passes it in, since
# the build context carries no .git.
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse --short HEAD 2>/dev/null)
DATE     ?= $(shell date -u +%Y-%m-%dT%H:%M:%SZ)
# What `baton version` prints (cmd/baton/version.go); `make build` links
# the same values.
VERSION_LDFLAGS = -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.date=$(DATE)
# ucx adds the UCX transport (needs libucx-dev); the image builds with it.
GO_TAGS  ?=
IMAGE    ?= baton

.PHONY: dist image image-cuda release

# -trimpath keeps the build machine's paths out of the binary and its panics;
# -s -w drop the symbol table and DWARF (stack traces keep their names).
# cgo stays on: the CPU kernels are C and link OpenBLAS.
dist:
	rm -rf $(DIST)
	mkdir -p $(DIST)/bin $(DIST)/share/doc/baton/docs
	CGO_ENABLED=1 $(GO) build -trimpath -buildvcs=false -tags '$(GO_TAGS)' \
		-ldflags '-s -w $(VERSION_LDFLAGS)' -o $(DIST)/bin/baton ./cmd/baton
	cp README.md LICENSE CHANGELOG.md $(DIST)/share/doc/baton/
	cp docs/*.md $(DIST)/share/doc/baton/docs/
	cp internal/bundled/LICENSE.md $(DIST)/share/doc/baton/stories260K-LICENSE.md
	$(DIST)/bin/baton version

image:
	docker build -f deploy/docker/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) -t $(IMAGE):cpu .

image-cuda:
	docker build -f deploy/docker/Dockerfile --build-arg VARIANT=cuda --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION)-cuda -t $(IMAGE):cuda .

# A release is an annotated tag of a committed tree whose CHANGELOG.md has
# a dated section for it; the tag's message is that section, so the notes
# and the changelog cannot differ. It tags only: pushing the tag and
# building from it (make dist VERSION=...) are separate steps, so a wrong
# tag can still be deleted before anyone sees it. VERSION must be given
# (the default above is git describe's, never a release).
release:
	@test "$(origin VERSION)" = "command line" || { echo "usage: make release VERSION=vX.Y.Z" >&2; exit 1; }
	@echo '$(VERSION)' | grep -Eqx 'v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?' || { echo "release: VERSION=$(VERSION) is not vMAJOR.MINOR.PATCH" >&2; exit 1; }
	@test -z "$$(git status --porcelain)" || { echo "release: the tree has changes not committed:" >&2; git status --short >&2; exit 1; }
	@grep -Eq '^## \[$(subst .,\.,$(VERSION:v%=%))\] - [0-9]{4}-[0-9]{2}-[0-9]{2}$$' CHANGELOG.md || { echo "release: CHANGELOG.md has no dated section '## [$(VERSION:v%=%)] - YYYY-MM-DD'" >&2; exit 1; }
	@! git rev-parse -q --verify 'refs/tags/$(VERSION)' >/dev/null || { echo "release: tag $(VERSION) exists" >&2; exit 1; }
	awk '/^## \[/ { if (on) exit; on = ($$0 ~ /^## \[$(subst .,\.,$(VERSION:v%=%))\]/) } on && !/^\[[^]]+\]: /' CHANGELOG.md | sed '1s/^## /baton /' | git tag -a --cleanup=verbatim -F - '$(VERSION)'
	@echo "tagged $(VERSION); push it with: git push origin $(VERSION)"
