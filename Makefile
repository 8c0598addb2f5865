# rdrr peer. `make demo` and `make test` work on a fresh Debian machine with Go.
GO       ?= go
BIN      ?= bin/peer
# wgpu-native warns without a writable runtime dir.
export XDG_RUNTIME_DIR ?= /tmp/rdrr-xdg-$(shell id -u)
# Executions per fuzz target for `make fuzz` (a count: see scripts/fuzz.sh),
# and in `make test`: 50000 took ~5 of its 21 minutes on a 2-core machine
# (the tokenizer's and the config's targets ~1100 executions a second).
FUZZEXECS ?= 200000
TESTFUZZEXECS ?= 30000
# Every go command builds with the patched dependencies of .build/go.mod
# (made by `make deps`; see scripts/patched-deps.sh). A plain `go build`
# without make uses upstream modules and works too, minus those patches.
export GOFLAGS := $(strip $(GOFLAGS) -modfile=$(CURDIR)/.build/go.mod)
# Packages of the patched dependencies that a patch adds code of ours to
# (swarm/pion-mux-queue.patch's queue, with its tests): their own tests.
PATCHEDPKGS ?= github.com/pion/webrtc/v4/internal/mux
# Tests a patch adds to a package whose other tests assume upstream
# behaviour (pion/sctp's TestStats expects the stock initial congestion
# window that swarm/pion-sctp-cwnd.patch raises): only ours run.
PATCHEDTESTS ?= github.com/pion/sctp:TestPacketizeFragmentsShareOneCopy
# Packages whose code is concurrent: run under the race detector.
RACEPKGS ?= $(patsubst %,./%/...,$(wildcard cas signaling swarm gpu tiers kernels)) ./experts/

.PHONY: all deps wasm build test test-short vet race fuzz bench demo clean

all: build

$(XDG_RUNTIME_DIR):
	@mkdir -p -m 0700 $@

deps: $(XDG_RUNTIME_DIR)
	@./scripts/deps.sh

# The browser peer (WebAssembly), embedded by `peer` and served at /app/.
wasm: deps
	@./scripts/build-wasm.sh

build: deps wasm
	$(GO) build -o $(BIN) ./cmd/peer

vet:
	$(GO) vet ./...

# The swarm tests run a second time against upstream pion (no -modfile):
# what `go install` and programs importing the swarm package get
# (DESIGN.md, "The SCTP packet size"). RDRR_EXPECT_BIG_PACKETS makes each
# run check which build it has.
test: deps vet wasm
	RDRR_EXPECT_BIG_PACKETS=1 $(GO) test -count=1 -timeout 15m ./...
	GOFLAGS= RDRR_EXPECT_BIG_PACKETS=0 $(GO) test -count=1 -short -timeout 10m ./swarm/...
	$(GO) test -count=1 -race -short -timeout 15m $(RACEPKGS)
	$(GO) test -count=1 -race $(PATCHEDPKGS)
	@set -e; for t in $(PATCHEDTESTS); do $(GO) test -count=1 -race -run "^$${t#*:}$$" $${t%%:*}; done
	@$(MAKE) --no-print-directory fuzz FUZZEXECS=$(TESTFUZZEXECS)

race: deps
	$(GO) test -count=1 -race -timeout 20m $(RACEPKGS)

# Every fuzz target, each for FUZZEXECS executions (go test -fuzz takes one
# target at a time).
fuzz: deps
	@./scripts/fuzz.sh $(FUZZEXECS)

bench: build
	@./scripts/bench.sh

demo: build
	@./scripts/demo.sh

clean:
	rm -rf bin
