# wasmcsi — the targets a Go developer types without reading.
#   make run        build the daemon and the example modules, serve CSI with the embedded config
#   make test       every test (root runs the real mount/loop/csi-sanity tiers; others skip with a reason)
#   make sanity     the csi-sanity binary against the daemon as make run starts it (root)
#   make test-vm    the privileged tier (device-mapper, iSCSI) inside a QEMU guest
#   make test-faults  power loss replayed from a dm-log-writes log, failing and full disks (root, QEMU)
#   make crash      kill the daemon at KILLS random points of a mixed workload and check (root; SEED=n repeats a run)
#   make test-nomad a Nomad dev agent runs the plugin from deploy/nomad and drives it (root)
#   make image      the wasmcsi image as a docker-archive (bin/image/wasmcsi.tar) without Docker or a registry (root)
#   make test-k8s   a single-node Kubernetes runs the chart's pods (helm install); upstream e2e storage suite (root)
#   make bench      benchmarks: module calls, CSI operation rates, primitives
#   make bench-sidebyside  wasmcsi and csi-driver-host-path measured in alternating rounds; ratios (root)
#   make bench-scale  costs with 100 and 10,000 volumes in one run: CreateVolume, ListVolumes, start-up, memory (root)
#   make bench-datapath  fio against published volumes and their floors, interleaved; ratios (root)
#   make lint       gofmt, go vet, staticcheck
#   make tinygo     print the TinyGo wrapper (built and cached on first use)

GO       ?= go
BIN      := bin
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS  := -s -w -X github.com/wasmcsi/wasmcsi/host.Version=$(VERSION)
EXAMPLES := $(patsubst examples/%/,%,$(sort $(dir $(wildcard examples/*/*.go))))
MODULES  := $(EXAMPLES:%=$(BIN)/modules/%.wasm)
TGMODULES:= $(EXAMPLES:%=$(BIN)/modules/%.tinygo.wasm)
GOSRC    := $(shell find abi sdk hostcalls host modules cmd examples -name '*.go' -not -name '*_test.go' 2>/dev/null) go.mod go.sum abi/go.mod sdk/go.mod
# The repository's Go modules, each tested, vetted and linted in its own
# folder as its users build it: the daemon (.); abi and sdk, all a backend
# module's build requires; sdk/moduletest, which runs a module in the
# daemon's runtime for tests; cmd/sidebyside, the side-by-side benchmark;
# cmd/mkimage, the image builder (go-containerregistry stays out of the
# daemon's module); cmd/testregistry, the OCI registry the signed-module
# tests start (the distribution project stays out of it too).
# No go.work: a local one would change what ./... means, so make ignores it.
GOMODS   := . abi sdk sdk/moduletest cmd/sidebyside cmd/mkimage cmd/testregistry
export GOWORK := off
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
BENCHTIME ?= 1s
SCALE_COUNT ?= 1
KILLS    ?= 1000

.PHONY: all build modules modules-tinygo run test sanity test-vm test-faults test-nomad test-k8s image crash bench bench-sidebyside bench-scale bench-datapath lint tinygo clean

all: build

build: $(BIN)/wasmcsi modules

$(BIN)/wasmcsi: $(GOSRC)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $@ ./cmd/wasmcsi

modules: $(MODULES)

$(BIN)/modules/%.wasm: $(GOSRC)
	@mkdir -p $(@D)
	GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 $(GO) build -buildmode=c-shared -trimpath -o $@ ./examples/$*

# TinyGo builds sit next to the standard ones as NAME.tinygo.wasm; the daemon
# serves them instead when prefer_tinygo is set.
modules-tinygo: $(TGMODULES)

$(BIN)/modules/%.tinygo.wasm: $(GOSRC)
	@mkdir -p $(@D)
	tinygo=$$(.ci/tinygo.sh) && $$tinygo build -buildmode=c-shared -scheduler=none -no-debug -o $@ ./examples/$*

run: build
	$(BIN)/wasmcsi serve

test:
	@failed=; for m in $(GOMODS); do \
		echo "== $$m"; (cd $$m && $(GO) test -count=1 -timeout 30m ./...) || failed="$$failed $$m"; \
	done; if [ -n "$$failed" ]; then echo "FAIL in modules:$$failed"; exit 1; fi

# csi-sanity as its own binary (csi-test, pinned) against bin/wasmcsi serve
# with the embedded configuration, in a temporary folder of its own.
sanity:
	GO=$(GO) bash .ci/sanity.sh

test-vm:
	bash .ci/vm/test.sh

# The power-loss and disk-fault tiers (host/faulttest) in the VM guest:
# FAULT_POINTS of the log's flush points (evenly sampled; "all" checks
# every one) over FAULT_ROUNDS rounds of the workload; about 40 s a point
# under TCG. make test-vm runs a sample of 4 points and one round.
# TinyGo modules: the guest compiles a Go-built one for minutes.
FAULT_POINTS ?= 200
FAULT_ROUNDS ?= 2
test-faults:
	WASMCSI_TINYGO=$${WASMCSI_TINYGO:-$$(.ci/tinygo.sh)} \
	VM_ENV="WASMCSI_POWERLOSS_POINTS=$(FAULT_POINTS) WASMCSI_POWERLOSS_ROUNDS=$(FAULT_ROUNDS)" \
	VM_TEST_ARGS="-test.timeout=6h" VM_TIMEOUT=$${VM_TIMEOUT:-22000} bash .ci/vm/test.sh ./host/faulttest

# make test runs the same test with 200 kill points spread over four seeds
# (20 with -short); this runs one seed (SEED, or a new one) on the daemon
# and modules that make build wrote, for as long as asked.
crash: build
	WASMCSI_TEST_DAEMON=$(abspath $(BIN)/wasmcsi) WASMCSI_MODULE_DIR=$(abspath $(BIN)/modules) \
	WASMCSI_CRASH_KILLS=$(KILLS) $(if $(SEED),WASMCSI_CRASH_SEED=$(SEED)) \
	$(GO) test -count=1 -v -timeout 0 -run '^TestCrash$$' ./host/crashtest/

# Nomad v1.11.3, built from the Go module proxy once (cached under
# /var/cache/wasmcsi/nomad-<version>), runs deploy/nomad/wasmcsi-raw.nomad.hcl
# with this tree's binaries; the nomad CLI and exec jobs drive every step.
test-nomad:
	GO=$(GO) bash .ci/nomad/test.sh

# The image deploy/Dockerfile describes, built without Docker or a
# registry by cmd/mkimage: the final stage's Debian packages by mmdebstrap
# (installed with apt-get when missing; the root filesystem is cached under
# /var/cache/wasmcsi/image per package list), this tree's daemon and
# modules from make build, the same paths and entrypoint. Root.
IMAGE_TAG ?= $(VERSION)
IMAGE_OUT ?= $(BIN)/image/wasmcsi.tar
image: build
	@command -v mmdebstrap >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap; }
	cd cmd/mkimage && $(GO) run . wasmcsi -dockerfile $(CURDIR)/deploy/Dockerfile -from $(CURDIR)/$(BIN) \
		-tag wasmcsi/wasmcsi:$(IMAGE_TAG) -out $(abspath $(IMAGE_OUT))

# Kubernetes v1.34.2 (control plane, kubelet, e2e.test) and the CSI
# sidecars, built once (cached under /var/cache/wasmcsi/k8s-v<version>); the
# sidecars the module proxy refuses come from WASMCSI_THIRDPARTY (default
# ../shared/thirdparty). Runs the external-storage e2e suite per backend
# (.ci/k8s/drivers); WASMCSI_K8S_FOCUS narrows it to one pass.
test-k8s:
	GO=$(GO) bash .ci/k8s/test.sh

bench:
	$(GO) test -run '^$$' -bench . -skip AtScale -benchtime $(BENCHTIME) -count 1 ./modules/ ./host/ ./hostcalls/... ./examples/...
	cd abi && $(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count 1 ./...

# Each run creates 10,000 volumes twice (about a minute) before it times
# anything, so make bench leaves these out. SCALE_COUNT runs repeat it.
bench-scale:
	$(GO) test -run '^$$' -bench AtScale -benchtime 10s -count $(SCALE_COUNT) -timeout 60m ./host/

# A module of its own (cmd/sidebyside/go.mod): the reference driver is built
# once from its source tarball in WASMCSI_THIRDPARTY (default
# ../shared/thirdparty) into WASMCSI_HOSTPATH_CACHE (default /var/cache/wasmcsi),
# or skipped with the reason. SIDEBYSIDE_FLAGS, e.g. -rounds 5 -duration 3s.
bench-sidebyside: build
	cd cmd/sidebyside && $(GO) run . -repo $(CURDIR) $(SIDEBYSIDE_FLAGS)

# fio (Debian's package, installed with apt-get when missing) against a
# published loopfile block, loopfile mount and localdir mount volume and
# against each one's floor on the pool's filesystem, interleaved (about
# 6 minutes). DATAPATH_FLAGS, e.g. -rounds 3 -runtime 20s.
bench-datapath: build
	@if [ "$$(id -u)" = 0 ] && ! command -v fio >/dev/null; then \
		echo "bench-datapath: apt-get install fio"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fio; \
	fi
	$(GO) run ./cmd/datapath -repo $(CURDIR) $(DATAPATH_FLAGS)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@set -e; for m in $(GOMODS); do echo "== $$m"; (cd $$m && $(GO) vet ./... && $(GO) run $(STATICCHECK) ./...); done
	@# What guests compile: the abi and sdk modules and the examples, as wasip1.
	cd abi && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...
	cd sdk && GOOS=wasip1 GOARCH=wasm $(GO) vet ./...
	GOOS=wasip1 GOARCH=wasm $(GO) vet ./examples/...

tinygo:
	@.ci/tinygo.sh

clean:
	rm -rf $(BIN) run
