# Ringfence build. `make help` lists the targets.
#
# Tools are installed by `go install` at pinned versions into .tmp/bin: nothing is downloaded
# from anywhere but the Go module proxy (and, for tests, Debian's docker.io package and, from
# the npm registry, the MCP clients of scripts/mcp-clients.sh).

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

TMP      := $(CURDIR)/.tmp
BIN      := $(TMP)/bin
OUT      := $(CURDIR)/bin
export PATH := $(BIN):$(PATH)

BUF_VERSION                  := v1.75.0
PROTOC_GEN_GO_VERSION        := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION   := v1.6.2
PROTOC_GEN_GATEWAY_VERSION   := v2.33.0
GRPCURL_VERSION              := v1.9.4
BENCHSTAT_VERSION            := v0.0.0-20260908200009-22c9c6c9d4da
GOLANGCI_LINT_VERSION        := v2.15.0

# Each tool: NAME@PACKAGE@VERSION. Installed with go install, which compiles it: on a cold
# machine with 2 cores buf takes about 3 minutes, golangci-lint about 2, grpcurl about 1, each
# plugin and benchstat well under 1; a tool already installed at its version costs nothing.
TOOLS := \
	buf@github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION) \
	protoc-gen-go@google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION) \
	protoc-gen-go-grpc@google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION) \
	protoc-gen-grpc-gateway@github.com/grpc-ecosystem/grpc-gateway/v2/protoc-gen-grpc-gateway@$(PROTOC_GEN_GATEWAY_VERSION) \
	grpcurl@github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION) \
	benchstat@golang.org/x/perf/cmd/benchstat@$(BENCHSTAT_VERSION) \
	golangci-lint@github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)

BINARIES := ringfence ringfenced ringfence-registry ringfence-publisher ringfence-pool ringfence-audit

# Packages tested by `make test`; TESTFLAGS adds flags (e.g. TESTFLAGS=-run=TestRegistry).
TEST_TIMEOUT ?= 30m
TESTFLAGS    ?=

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

# install installs the tools of $(1) (specs of TOOLS) that are missing or at another version,
# saying which and that it compiles; nothing is printed when all are there.
define install
	@mkdir -p $(BIN)
	@for spec in $(1); do \
		name=$${spec%%@*}; pkg=$${spec#*@}; stamp=$(BIN)/.$$name.$${pkg##*@}; \
		if [ ! -x $(BIN)/$$name ] || [ ! -f $$stamp ]; then \
			echo "tools: installing $$name ($$pkg; go install compiles it: a minute or more on a cold machine)"; \
			GOBIN=$(BIN) go install $$pkg; \
			rm -f $(BIN)/.$$name.*; touch $$stamp; \
		fi; \
	done
endef

.PHONY: tools
tools: ## Install every pinned tool into .tmp/bin (buf, protoc plugins, grpcurl, benchstat, golangci-lint: ~8 min cold on 2 cores).
	$(call install,$(TOOLS))

.PHONY: grpcurl
grpcurl: ## Install only grpcurl into .tmp/bin, for the README's examples (~1 min cold on 2 cores).
	$(call install,$(filter grpcurl@%,$(TOOLS)))

.PHONY: generate
generate: tools ## Regenerate the gRPC, protobuf and gateway stubs in gen/go.
	rm -rf gen/go/ringfence
	buf generate
	cd gen/go && go mod tidy

.PHONY: checkgenerate
checkgenerate: generate ## Fail when the committed generated code is stale.
	@if [ -n "$$(git status --porcelain -- gen/go proto)" ]; then \
		git status --porcelain -- gen/go proto; \
		echo "generated code is stale: run 'make generate' and commit the result"; exit 1; \
	fi

.PHONY: lint
lint: tools ## buf lint, go vet, gofmt and golangci-lint (staticcheck, and depguard for the layering).
	buf lint
	go vet ./... ./gen/go/... ./mcpgate/...
	golangci-lint run ./...
	cd mcpgate && golangci-lint run -c ../.golangci.yml ./...
	@bad=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
	if [ -n "$$bad" ]; then echo "gofmt would change:"; echo "$$bad"; exit 1; fi

# The binaries are rebuilt only when a Go source (tests aside), go.mod or go.sum is newer than
# they are, so a make run with nothing changed builds nothing and prints nothing. They are
# static (CGO_ENABLED=0): deploy/Dockerfile copies them into a FROM-scratch image, which has no
# loader, and since an up-to-date build is skipped, CGO_ENABLED given on the command line
# would not rebuild them.
GO_SOURCES := $(shell find cmd internal services gen mcpgate examples -name '*.go' ! -name '*_test.go' 2>/dev/null) \
	go.mod go.sum go.work gen/go/go.mod gen/go/go.sum mcpgate/go.mod mcpgate/go.sum
BIN_FILES  := $(addprefix $(OUT)/,$(BINARIES))
# The commit the binaries are built from (--version), "+modified" with uncommitted changes.
REVISION   = $(shell r=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null && echo $$r || echo $$r+modified; })
# A commit changes the revision without touching a source: $(OUT)/.revision holds the one the
# binaries were built with, rewritten when it differs, so that they are rebuilt and --version
# does not name the commit before (or "+modified" for what is now committed).
REVISION_FILE := $(OUT)/.revision
$(shell mkdir -p '$(OUT)' && r='$(REVISION)' && { [ "$$(cat '$(REVISION_FILE)' 2>/dev/null)" = "$$r" ] || printf '%s\n' "$$r" > '$(REVISION_FILE)'; })

.PHONY: build
build: $(BIN_FILES) ## Build every binary into ./bin (~3 min cold on 2 cores; seconds with Go's build cache warm).

$(BIN_FILES) &: $(GO_SOURCES) $(REVISION_FILE)
	@echo "build: compiling $(words $(BINARIES)) binaries into ./bin (about 3 minutes on a cold machine with 2 cores, seconds once Go's build cache is warm)"
	@mkdir -p $(OUT)
	@CGO_ENABLED=0 go build -trimpath -ldflags "-X github.com/ringfence/ringfence/internal/version.revision=$(REVISION)" -o $(OUT)/ $(addprefix ./cmd/,$(BINARIES))
	@touch $(BIN_FILES)

.PHONY: docker
docker: ## Make sure a Docker engine answers (installs Debian's docker.io and starts dockerd if needed).
	@./scripts/ensure-docker.sh

.PHONY: mcp-clients
mcp-clients: ## Install the pinned MCP clients the front door's end-to-end tests drive (conformance suite, Inspector, Node 22) into .tmp (~20 s cold).
	./scripts/mcp-clients.sh

.PHONY: test
test: tools docker lint checkgenerate mcp-clients ## The whole test suite: lint, generated code, unit and end-to-end tests.
	./scripts/ensure-docker.sh --registry
	go test -race -timeout $(TEST_TIMEOUT) $(TESTFLAGS) ./... ./mcpgate/...

.PHONY: bench
bench: tools docker ## Every benchmark behind docs/benchmarks.md, summarized by benchstat (COUNT=6).
	./scripts/bench.sh

.PHONY: run
run: build docker ## Run the all-in-one server with the demo (cold: ~3 min build, <1 min image; cached: seconds).
	@./scripts/demo.sh

.PHONY: clean
clean: ## Remove build outputs, installed tools, and the Docker images this checkout built (only those).
	./scripts/clean-images.sh
	rm -rf $(OUT) $(TMP)
