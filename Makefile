GO ?= go
BIN := bin/payouts
DEMO_BIN := bin/payouts-demo
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X github.com/payouts/payouts/internal/obs.version=$(VERSION) -X github.com/payouts/payouts/internal/obs.revision=$(REVISION)
STATICCHECK ?= staticcheck

.PHONY: build test lint demo up bench chaos clean image

# A static binary (no cgo, no build paths), stamped with the version and the
# commit it was built from (`payouts version -o json`, payouts_build_info).
build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) .

# The whole suite: real PostgreSQL and embedded etcd, race detector on.
# The primaries are then compiled out (build tag negativecontrol) to show
# each invariant's detective control fire; only the negative-control tests
# run there, since the ordinary guard tests are meant to fail without them.
NEGATIVE_PKGS := ./negativecontrol/ ./payment/ ./railproxy/ ./lock/

test:
	$(GO) test -race -count=1 -timeout 60m ./...
	$(GO) test -race -count=1 -timeout 30m -tags negativecontrol -run NegativeControl $(NEGATIVE_PKGS)

# staticcheck: honnef.co/go/tools v0.8.2 (.ci/run installs it).
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags negativecontrol ./...
	$(STATICCHECK) ./...

# The guided demo: throwaway PostgreSQL + embedded etcd, every role as a
# process, a stale holder fenced out, nothing paid twice. Its binary is built
# with -tags crashpoints so the executors honour the hold hook the demo uses
# to freeze a holder between its lease check and its write (never ship it);
# `payouts dev demo` from an ordinary build freezes a holder by timing.
demo:
	$(GO) build -tags crashpoints -ldflags "$(LDFLAGS)" -o $(DEMO_BIN) .
	./$(DEMO_BIN) dev demo --dir .dev/demo

# Keep the stack running in the foreground (Ctrl-C stops it).
up: build
	./$(BIN) dev up --dir .dev/stack

# The chaos run at full size (docs/safety.md, e2e/chaos_test.go), on the etcd then
# the PostgreSQL lock backend: 10,000 payouts over 250 accounts, 4 executors,
# 110 faults per backend drawn from one printed seed, then drain, reconcile and
# the rail's settlement report against the ledger. PAYOUTS_CHAOS_SEED replays a
# seed; PAYOUTS_CHAOS_PAYOUTS, _ACCOUNTS, _EXECUTORS, _FAULTS, _DURATION (per
# backend) and _BACKEND (etcd, postgres or both) change the run. The fault
# timelines and grant logs go to CHAOS_OUT; the last line is the verdict
# `chaos: seed=S payouts=N faults=F duplicates=D lost=L balanced=B terminal=P%`.
CHAOS_OUT ?= .dev/chaos
chaos:
	@mkdir -p $(CHAOS_OUT)
	@{ PAYOUTS_CHAOS=$${PAYOUTS_CHAOS:-full} PAYOUTS_CHAOS_OUT=$(abspath $(CHAOS_OUT)) \
		$(GO) test -count=1 -timeout 40m -run '^TestChaosRun$$' -v ./e2e/ 2>&1; echo $$? > $(CHAOS_OUT)/exit-code; } \
		| tee $(CHAOS_OUT)/chaos.log
	@echo "log, fault timelines and grant logs: $(CHAOS_OUT)"
	@grep '^chaos: ' $(CHAOS_OUT)/chaos.log | tail -n 1; exit $$(cat $(CHAOS_OUT)/exit-code)

bench:
	$(GO) test -run '^$$' -bench . -benchtime 2s ./...

# The container image: the static binary (no cgo, no build paths, version
# stamped, symbols stripped) on an empty base, tagged $(IMAGE):dev and
# $(IMAGE):$(VERSION). The binary is built here, not in a build stage, so
# no base image is pulled. DOCKER_BUILDKIT=0 uses the builder every Docker
# engine has; set DOCKER_BUILDKIT=1 where buildx is installed.
IMAGE ?= payouts
IMAGE_CONTEXT := bin/image
DOCKER ?= docker
DOCKER_BUILDKIT ?= 0

image:
	rm -rf $(IMAGE_CONTEXT)/state
	mkdir -p $(IMAGE_CONTEXT)/state
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS) -s -w" -o $(IMAGE_CONTEXT)/payouts .
	DOCKER_BUILDKIT=$(DOCKER_BUILDKIT) $(DOCKER) build -f deploy/Dockerfile \
		--build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) \
		-t $(IMAGE):dev -t $(IMAGE):$(VERSION) $(IMAGE_CONTEXT)

clean:
	rm -rf bin .dev
