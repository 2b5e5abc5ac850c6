# certworker. `make test` is what CI runs (.ci/run).
GO       ?= go
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT   ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS  := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# The PostgreSQL image the tests and the demo start. Where an image can be pulled the
# public default (postgres:17-alpine) is used; on a machine without a registry,
# `make pg-image` builds certworker-postgres:15 from Debian's packages, and the
# targets below pick it up when it exists.
LOCAL_PG_IMAGE := certworker-postgres:15
# Evaluated when a recipe runs, after pg-image-if-needed may have built the image.
PG_ENV = CERTWORKER_PG_IMAGE=$${CERTWORKER_PG_IMAGE:-$$(docker image inspect $(LOCAL_PG_IMAGE) >/dev/null 2>&1 && echo $(LOCAL_PG_IMAGE))}
export TESTCONTAINERS_RYUK_DISABLED ?= true

.PHONY: all build test lint bench demo pg-image pg-image-if-needed clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/certworker ./cmd/certworker

# Every test, with the race detector, against real PostgreSQL (a container, or
# TEST_DATABASE_URL) and an in-process Pebble.
test: pg-image-if-needed
	$(PG_ENV) $(GO) test -race -count=1 -timeout 30m ./...

lint:
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...

# Benchmarks: wake latency and claim throughput (queue), issuance rate (acme).
bench: pg-image-if-needed
	mkdir -p bench
	$(PG_ENV) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 60m ./... | tee bench/results.txt

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
