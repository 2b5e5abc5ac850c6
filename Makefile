# certworker. `make test` is what CI runs (.ci/run).
GO       ?= go
# The release's version is written once, in VERSION (the binary embeds it; the
# images and `make release` are tagged with it). The commit is the checkout's, -dirty
# with changes: go build records it by itself in a clone, but not in a git worktree
# (whose .git is a file), so it is passed here too. Either can be overridden
# (make build VERSION=... COMMIT=...); an empty one leaves the binary's own.
VERSION  ?= $(shell cat VERSION)
COMMIT   ?= $(shell git rev-parse HEAD 2>/dev/null)$(shell test -n "$$(git status --porcelain 2>/dev/null)" && echo -dirty)
LDFLAGS  := -s -w $(if $(VERSION),-X main.version=$(VERSION)) $(if $(COMMIT),-X main.commit=$(COMMIT))
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
# bash, for pipefail (bench).
SHELL := /bin/bash

# The PostgreSQL image the tests and the demo start. Where an image can be pulled the
# public default (postgres:17-alpine) is used; on a machine without a registry,
# `make pg-image` builds certworker-postgres:15 from Debian's packages, and the
# targets below pick it up when it exists.
LOCAL_PG_IMAGE := certworker-postgres:15
# Evaluated when a recipe runs, after pg-image-if-needed may have built the image.
PG_ENV = CERTWORKER_PG_IMAGE=$${CERTWORKER_PG_IMAGE:-$$(docker image inspect $(LOCAL_PG_IMAGE) >/dev/null 2>&1 && echo $(LOCAL_PG_IMAGE))}
export TESTCONTAINERS_RYUK_DISABLED ?= true

.PHONY: all build test test-short lint bench demo pg-image pg-image-if-needed image image-test alerts-test deploy-check release clean clean-containers

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/certworker ./cmd/certworker

# The container image (deploy/Dockerfile): FROM scratch, the static binary and this
# machine's CA roots, so it builds with no registry. Tagged $(IMAGE) and
# certworker:latest.
IMAGE     ?= certworker:$(VERSION)
CA_BUNDLE ?= $(firstword $(wildcard /etc/ssl/certs/ca-certificates.crt /etc/pki/tls/certs/ca-bundle.crt /etc/ssl/cert.pem))

image:
	@test -n "$(CA_BUNDLE)" || { echo "no CA bundle found on this machine; set CA_BUNDLE=/path/to/roots.pem" >&2; exit 1; }
	rm -rf bin/image && mkdir -p bin/image
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/image/certworker ./cmd/certworker
	cp $(CA_BUNDLE) bin/image/ca-certificates.crt
	docker build -q -f deploy/Dockerfile -t $(IMAGE) -t certworker:latest bin/image

# A release of VERSION, in bin/release/: the static binaries for linux/amd64 and
# linux/arm64, a CycloneDX SBOM of each (cyclonedx-gomod, a Go module run through the
# module proxy, as staticcheck is), the image (FROM scratch with the linux/amd64
# binary, saved as a tarball; the legacy builder makes images of this machine's
# platform only), and SHA256SUMS of them all. Nothing is fetched but Go modules.
# A release is a commit: it refuses a tree with changes, and builds from a fresh
# clone of HEAD, where the SBOM tool can read the version from git (it cannot in a
# git worktree, whose .git is a file). Tag the commit vVERSION (CHANGELOG.md).
RELEASE_DIR       := bin/release
RELEASE_PLATFORMS := linux/amd64 linux/arm64
CYCLONEDX_GOMOD   := github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@v1.10.0

release:
	@test -z "$$(git status --porcelain)" || { echo "make release builds a commit: commit or stash the changes first" >&2; exit 1; }
	@test -n "$(CA_BUNDLE)" || { echo "no CA bundle found on this machine; set CA_BUNDLE=/path/to/roots.pem" >&2; exit 1; }
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)/image
	git clone -q . $(RELEASE_DIR)/src && git -C $(RELEASE_DIR)/src checkout -q --detach $$(git rev-parse HEAD)
	set -e; for p in $(RELEASE_PLATFORMS); do os=$${p%/*}; arch=$${p#*/}; out=certworker_$(VERSION)_$${os}_$${arch}; \
	  (cd $(RELEASE_DIR)/src && CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o ../$$out ./cmd/certworker); \
	  (cd $(RELEASE_DIR)/src && $(GO) run -exec "env GOOS=$$os GOARCH=$$arch CGO_ENABLED=0" $(CYCLONEDX_GOMOD) app -json -licenses -main cmd/certworker -output ../$$out.cdx.json .); \
	done
	cp $(RELEASE_DIR)/certworker_$(VERSION)_linux_amd64 $(RELEASE_DIR)/image/certworker
	cp $(CA_BUNDLE) $(RELEASE_DIR)/image/ca-certificates.crt
	docker build -q -f deploy/Dockerfile -t $(IMAGE) $(RELEASE_DIR)/image
	docker save $(IMAGE) | gzip -n > $(RELEASE_DIR)/certworker_$(VERSION)_image_linux_amd64.tar.gz
	rm -rf $(RELEASE_DIR)/src $(RELEASE_DIR)/image
	cd $(RELEASE_DIR) && sha256sum certworker_* > SHA256SUMS && cat SHA256SUMS

# The image against a throwaway PostgreSQL (the image the tests use): migrate, run,
# /readyz answering 200. What CI runs after building it.
image-test: image pg-image-if-needed
	$(PG_ENV) bash deploy/smoke.sh $(IMAGE)

# The alert rules and their tests (deploy/alerts.yaml, deploy/alerts_test.yaml), with
# promtool (Debian's prometheus package).
alerts-test:
	promtool check rules deploy/alerts.yaml
	cd deploy && promtool test rules alerts_test.yaml

# The deploy files' syntax, offline: compose's own parser, and kustomize's rendering
# of deploy/kubernetes where kubectl is installed.
deploy-check:
	@if command -v docker-compose >/dev/null 2>&1; then \
	  docker-compose -f deploy/compose.yaml --env-file deploy/.env.example config -q && echo "deploy/compose.yaml parses with deploy/.env.example"; \
	else echo "docker-compose is not installed: deploy/compose.yaml not checked"; fi
	@if command -v kubectl >/dev/null 2>&1; then \
	  kubectl kustomize deploy/kubernetes >/dev/null && echo "deploy/kubernetes renders"; \
	else echo "kubectl is not installed: deploy/kubernetes not rendered"; fi

# Every test, with the race detector, against real PostgreSQL (a container, or
# TEST_DATABASE_URL) and an in-process Pebble.
# deploy/helm/charttest, a module of its own (Helm and the Kubernetes client
# libraries stay out of certworker's), lints and renders the Helm chart; ./... does not
# reach it, so it runs after. .ci/test-tools first installs promtool and pgbouncer
# where it can, or says in one line how to.
#
# Four packages at once on two cores (-p 4), and four tests at once in each
# (-parallel 4; go test's default is the number of cores): the tests spend much of
# their time waiting on PostgreSQL, Pebble and the clock, so more of them keep both
# cores busy. The longest go first (TEST_FIRST, the rest of ./... after them): a
# long one started last would keep the run going alone. internal/failover, whose
# tests mostly wait (for promotions, leases, timers), starts among them, beside the
# busy ones: started fourth with -p 3, it kept the run going 2 minutes after the
# others (go test from a clean clone, quiet: 332 s with -p 3, 282 s with -p 4 and
# this order).
#
# -trimpath keeps the checkout's directory out of what the build cache keys on, so a
# fresh clone (CI's, a second worktree) reuses the race-built packages an earlier run
# compiled instead of compiling every package of this module again while the first
# packages' tests run.
TEST_P        ?= 4
TEST_PARALLEL ?= 4
TEST_FIRST    := ./internal/e2e ./internal/failover ./queue ./queue/worker ./acme ./cmd/certworker ./migrations ./internal/fakeworker ./listener ./certstore
test: pg-image-if-needed
	bash .ci/test-tools
	$(PG_ENV) $(GO) test -race -trimpath -count=1 -timeout 30m -p $(TEST_P) -parallel $(TEST_PARALLEL) $(TEST_FIRST) ./...
	cd deploy/helm/charttest && $(GO) test -race -trimpath -count=1 -timeout 10m ./...

# The tests that need no container (go test -short: a test that needs PostgreSQL
# skips), for the edit-compile loop; no race detector, so that it stays quick.
# `make test` stays the whole suite.
test-short:
	$(GO) test -short -count=1 ./...

lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	cd internal/riverbench && $(GO) vet ./...
	cd deploy/helm/charttest && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...

# Benchmarks: every package's, one package at a time (-p 1: two packages measuring at
# once on two cores would measure each other), each writing its table to bench/;
# bench/results.txt is go test's own output. The exit status is go test's, not tee's.
# internal/riverbench is a module of its own (River stays out of certworker's), which
# ./... does not reach: it runs after, its output appended.
bench: pg-image-if-needed
	mkdir -p bench
	set -o pipefail; $(PG_ENV) $(GO) test -p 1 -run '^$$' -bench . -benchtime 1x -timeout 90m ./... | tee bench/results.txt
	set -o pipefail; cd internal/riverbench && $(PG_ENV) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m . | tee -a ../../bench/results.txt

# One command, nothing installed: PostgreSQL in a container, Pebble in-process, the
# worker, and a tenant verifying a handful of domains.
demo: pg-image-if-needed
	$(PG_ENV) $(GO) run ./internal/demo

# Builds the local PostgreSQL image (cached: nothing happens when it exists).
pg-image:
	bash internal/pgimage/build.sh $(LOCAL_PG_IMAGE)

# Builds the local image only when neither TEST_DATABASE_URL, CERTWORKER_PG_IMAGE nor
# the public image is available.
pg-image-if-needed:
	@if [ -z "$$TEST_DATABASE_URL" ] && [ -z "$$CERTWORKER_PG_IMAGE" ] \
	  && ! docker image inspect postgres:17-alpine >/dev/null 2>&1 \
	  && ! docker pull -q postgres:17-alpine >/dev/null 2>&1; then \
	    echo "postgres:17-alpine cannot be pulled; building $(LOCAL_PG_IMAGE) from Debian's packages"; \
	    bash internal/pgimage/build.sh $(LOCAL_PG_IMAGE); \
	fi

clean:
	rm -rf bin

# Containers of a test run that was killed before it could remove them (Ryuk, the
# reaper that would, is off). Every testcontainers container on this Docker host.
clean-containers:
	docker ps -aq --filter label=org.testcontainers=true | xargs -r docker rm -f -v
