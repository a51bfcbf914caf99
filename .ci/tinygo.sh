#!/bin/sh
# tinygo.sh prints, on stdout, the path of a tinygo wrapper that builds
# wasmcsi backend modules (wasip1 reactors), and prints nothing else there.
#
#   TINYGO=$(.ci/tinygo.sh)
#   $TINYGO build -buildmode=c-shared -scheduler=none -no-debug -o x.wasm ./examples/localdir
#
# The wrapper selects the wasip1 target unless the caller passes -target;
# -target=wasip1, what a TinyGo release needs, also selects it.
#
# Where the tinygo comes from:
#   1. tinygo on PATH, if it is at least 0.42.0 and passes a smoke build of
#      a reactor;
#   2. otherwise TinyGo 0.42.0 built from the Go module proxy against
#      Debian's LLVM, linking Debian's prebuilt wasi-libc and wasm32
#      compiler-rt (the module zip has no git submodules, so it cannot build
#      its own). Needs Debian (apt) and Go >= 1.25 on PATH or at /usr/local/go;
#      installs missing packages with apt (root, or sudo).
# Results are cached under ${WASMCSI_TINYGO_CACHE:-/var/cache/wasmcsi/tinygo},
# keyed by TinyGo, LLVM and Go versions; a second run only checks the cache.
# Quiet: progress goes to a log (and a line to stderr when it is a terminal);
# on failure the log's tail goes to stderr.
#
# Limits of the built TinyGo: packages net and net/http are unavailable to
# guests (TinyGo's net is a submodule missing from the zip); ESP32 flashing
# is stubbed out; `tinygo run`/`tinygo test` have no wasm emulator configured.
set -eu

TINYGO_VERSION=0.42.0 # the oldest TinyGo accepted from PATH, and the one built
LLVM=19               # Debian bookworm's newest LLVM; TinyGo 0.42 supports it
CACHE=${WASMCSI_TINYGO_CACHE:-/var/cache/wasmcsi/tinygo}
PKGS="llvm-$LLVM-dev libclang-$LLVM-dev clang-$LLVM lld-$LLVM binaryen wasi-libc libclang-rt-$LLVM-dev-wasm32"
LLVM_BIN=/usr/lib/llvm-$LLVM/bin

say() { printf 'tinygo.sh: %s\n' "$*" >&2; }
note() { if [ -t 2 ]; then say "$*"; fi; }
die() {
	say "$*"
	exit 1
}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/wasmcsi-tinygo.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
LOG=$TMP/log

# run runs a command with its output in the log; on failure it prints the
# log's tail and exits.
run() {
	printf '+ %s\n' "$*" >>"$LOG"
	if ! "$@" >>"$LOG" 2>&1; then
		say "failed: $*"
		say "last lines of the log:"
		tail -n 40 "$LOG" >&2
		exit 1
	fi
}

case $CACHE in
/*) ;;
*) CACHE=$(pwd)/$CACHE ;;
esac
case $CACHE in
*"'"* | *'
'*) die "WASMCSI_TINYGO_CACHE must not contain quotes or newlines: $CACHE" ;;
esac

# version_ge A B: A >= B for dotted versions.
version_ge() {
	[ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n 1)" = "$2" ]
}

# write_wrapper OUT TINYGO TARGET [TINYGOROOT PATH-PREFIX]
write_wrapper() {
	{
		echo '#!/bin/sh'
		echo "# tinygo for wasmcsi backend modules, written by .ci/tinygo.sh."
		echo "# Selects the wasip1 target for build, run, test, list and info unless -target is given."
		if [ $# -ge 5 ]; then
			echo "TINYGOROOT='$4'"
			echo "PATH='$5':\$PATH"
			echo 'export TINYGOROOT PATH'
		fi
		echo "tinygo='$2'"
		echo "target='$3'"
		wrapper_body
	} >"$1.new"
	chmod 0755 "$1.new"
	mv -f "$1.new" "$1"
}

# wrapper_body prints what follows a wrapper's settings; its first line
# marks the version, so an older cached wrapper is rewritten (upgrade_wrapper).
wrapper_body() {
	cat <<'EOF'
# wrapper v2: -target=wasip1 is this target
case ${1-} in
build | run | test | list | info) ;;
*) exec "$tinygo" "$@" ;;
esac
cmd=$1
shift
own=-target=$target
for arg; do
	shift
	case $arg in
	-target=wasip1 | --target=wasip1)
		set -- "$@" "$own"
		own=
		;;
	-target | -target=* | --target | --target=*)
		set -- "$@" "$arg"
		own=
		;;
	*) set -- "$@" "$arg" ;;
	esac
done
exec "$tinygo" "$cmd" ${own:+"$own"} "$@"
EOF
}

# upgrade_wrapper rewrites an older wrapper's body, keeping its settings.
upgrade_wrapper() {
	grep -q '^# wrapper v2:' "$1" && return 0
	{
		sed -n "1,/^target=/p" "$1"
		wrapper_body
	} >"$1.new" && chmod 0755 "$1.new" && mv -f "$1.new" "$1"
}

# smoke WRAPPER builds a reactor with one export and checks it is wasm.
smoke() {
	mkdir -p "$TMP/smoke"
	printf 'module smoke\n\ngo 1.25\n' >"$TMP/smoke/go.mod"
	cat >"$TMP/smoke/main.go" <<'EOF'
package main

//go:wasmexport add
func add(a, b uint32) uint32 { return a + b }

func main() {}
EOF
	(cd "$TMP/smoke" && "$1" build -buildmode=c-shared -scheduler=none -no-debug -o smoke.wasm .) >>"$LOG" 2>&1 &&
		[ "$(od -An -tx1 -N4 "$TMP/smoke/smoke.wasm" | tr -d ' \n')" = 0061736d ]
}

# 1. A tinygo on PATH, unless it is one of our own wrappers.
if found=$(command -v tinygo 2>/dev/null); then
	real=$(readlink -f "$found")
	case $real in
	"$(readlink -f "$CACHE" 2>/dev/null || echo "$CACHE")"/*) found= ;;
	esac
fi
if [ -n "${found-}" ]; then
	line=$("$found" version 2>/dev/null || true)
	have=$(printf '%s\n' "$line" | sed -n 's/^tinygo version \([0-9][0-9.]*\).*/\1/p')
	if [ -z "$have" ]; then
		note "ignoring $found: cannot read its version"
	elif ! version_ge "$have" "$TINYGO_VERSION"; then
		note "ignoring $found: version $have is older than $TINYGO_VERSION"
	else
		id=$(printf '%s\n%s\n' "$real" "$line" | sha256sum | cut -c 1-16)
		dir=$CACHE/path-$id
		if [ -f "$dir/ok" ]; then
			echo "$dir/bin/tinygo"
			exit 0
		fi
		mkdir -p "$dir/bin" || die "cannot create $dir; set WASMCSI_TINYGO_CACHE to a writable folder"
		write_wrapper "$dir/bin/tinygo" "$real" wasip1
		if smoke "$dir/bin/tinygo"; then
			printf '%s\n' "$line" >"$dir/ok"
			echo "$dir/bin/tinygo"
			exit 0
		fi
		say "ignoring $found: it cannot build a wasip1 reactor (log tail follows)"
		tail -n 20 "$LOG" >&2
		rm -rf "$dir"
	fi
fi

# 2. Our own build.
if command -v go >/dev/null 2>&1; then
	GO=$(command -v go)
elif [ -x /usr/local/go/bin/go ]; then
	GO=/usr/local/go/bin/go
else
	die "no Go toolchain: put go on PATH or install it at /usr/local/go"
fi
GOVERSION=$("$GO" env GOVERSION) || die "$GO env GOVERSION failed"
GOMINOR=$(printf '%s\n' "$GOVERSION" | sed -n 's/^go\([0-9]*\.[0-9]*\).*/\1/p')
if [ -z "$GOMINOR" ] || ! version_ge "$GOMINOR" 1.25; then
	die "TinyGo $TINYGO_VERSION needs Go 1.25 or newer; $GO is $GOVERSION"
fi
GOBIN_DIR=$(dirname "$(readlink -f "$GO")")
command -v dpkg-query >/dev/null 2>&1 ||
	die "no tinygo >= $TINYGO_VERSION on PATH, and building one needs Debian (apt)"

# The tinygo binary refuses a GOROOT newer than the Go it was built with, so
# the Go minor version is part of the key.
dir=$CACHE/tinygo-$TINYGO_VERSION-llvm$LLVM-go$GOMINOR
wrapper=$dir/bin/tinygo

missing_pkgs() {
	# shellcheck disable=SC2086 # PKGS is a list
	status=$(dpkg-query -W -f='${Package} ${db:Status-Abbrev}\n' $PKGS 2>/dev/null || true)
	for p in $PKGS; do
		printf '%s\n' "$status" | grep -q "^$p ii" || printf '%s ' "$p"
	done
}

ready() {
	[ -f "$dir/ok" ] && [ -z "$(missing_pkgs)" ] && upgrade_wrapper "$wrapper" && "$wrapper" version >/dev/null 2>&1
}

if ready; then
	echo "$wrapper"
	exit 0
fi

if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
	die "cannot write $CACHE; run as root or set WASMCSI_TINYGO_CACHE to a writable folder"
fi
# One builder at a time; whoever waited finds the work done.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$CACHE/.lock"
	flock 9
fi

missing=$(missing_pkgs)
if [ -n "$missing" ]; then
	sudo=
	if [ "$(id -u)" != 0 ]; then
		command -v sudo >/dev/null 2>&1 || die "need root (or sudo) to install: $missing"
		sudo=sudo
	fi
	note "installing with apt: $missing"
	run ${sudo:+"$sudo"} apt-get update
	# shellcheck disable=SC2086 # sudo may be empty; missing is a list
	run $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
fi
if ready; then
	echo "$wrapper"
	exit 0
fi

note "building TinyGo $TINYGO_VERSION against LLVM $LLVM with $GOVERSION in $dir (about a minute)"
started=$(date +%s)
export GOWORK=off GOFLAGS=-buildvcs=false GOTOOLCHAIN=local

# Source from the module proxy, downloaded outside any module.
json=$(cd "$TMP" && "$GO" mod download -json "github.com/tinygo-org/tinygo@v$TINYGO_VERSION" 2>>"$LOG") || {
	say "downloading TinyGo $TINYGO_VERSION failed:"
	printf '%s\n' "$json" | tail -n 20 >&2
	tail -n 20 "$LOG" >&2
	exit 1
}
src=$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
[ -d "$src" ] || die "go mod download reported no folder for TinyGo $TINYGO_VERSION"

rm -rf "$dir"
mkdir -p "$dir/bin"
root=$dir/root
run cp -R "$src" "$root"
run chmod -R u+w "$root"

# tinygo.org/x/espflasher (ESP32 flashing only) is not served by every
# module proxy; a stub keeps the rest of the compiler buildable.
mkdir -p "$dir/espflasher-stub/pkg/espflasher"
printf 'module tinygo.org/x/espflasher\n\ngo 1.22\n' >"$dir/espflasher-stub/go.mod"
cat >"$dir/espflasher-stub/pkg/espflasher/stub.go" <<'EOF'
// Package espflasher is a stub: ESP32 flashing is not needed for wasm.
package espflasher

import (
	"errors"
	"io"
)

type ResetMode int

const ResetUSBJTAG ResetMode = 1

type StdoutLogger struct{ W io.Writer }

type Options struct {
	Compress  bool
	Logger    interface{}
	ResetMode ResetMode
}

func DefaultOptions() *Options { return &Options{} }

type Flasher struct{}

var errStub = errors.New("espflasher: stubbed out in this TinyGo build")

func New(port string, opts *Options) (*Flasher, error)                   { return nil, errStub }
func (f *Flasher) Close() error                                           { return nil }
func (f *Flasher) ChipName() string                                       { return "" }
func (f *Flasher) EraseFlash(progress func(int, int)) error               { return errStub }
func (f *Flasher) FlashImage(d []byte, off uint32, p func(int, int)) error { return errStub }
func (f *Flasher) Reset()                                                 {}
EOF
(cd "$root" && run "$GO" mod edit -replace tinygo.org/x/espflasher=../espflasher-stub)

# The compiler links Debian's libLLVM/libclang through cgo; building it with
# the same LLVM's clang needs no gcc. Without the byollvm tag tinygo runs
# clang-$LLVM and wasm-ld-$LLVM as external programs.
(cd "$root" && run env CGO_ENABLED=1 CC="$LLVM_BIN/clang" CXX="$LLVM_BIN/clang++" \
	"$GO" build -tags="llvm$LLVM" -o build/tinygo .)

# src/net is a submodule missing from the zip; an empty folder lets the
# GOROOT overlay be built (net/url and net/netip still come from Go).
mkdir -p "$root/src/net"

# targets/wasip1.json of TinyGo $TINYGO_VERSION, with Debian's prebuilt
# wasi-libc and compiler-rt linked instead of libc/rtlib built from the
# missing sources ("inherits" cannot unset libc/rtlib, hence a full copy).
cat >"$dir/wasip1.json" <<EOF
{
	"llvm-target":   "wasm32-unknown-wasi",
	"cpu":           "generic",
	"features":      "+bulk-memory,+bulk-memory-opt,+call-indirect-overlong,+mutable-globals,+nontrapping-fptoint,+sign-ext,-multivalue,-reference-types",
	"build-tags":    ["tinygo.wasm"],
	"goos":          "wasip1",
	"goarch":        "wasm",
	"linker":        "wasm-ld",
	"gc":            "precise",
	"scheduler":     "asyncify",
	"default-stack-size": 65536,
	"cflags": [
		"-mbulk-memory", "-mnontrapping-fptoint", "-mno-multivalue",
		"-mno-reference-types", "-msign-ext",
		"-nostdlibinc", "-isystem", "/usr/include/wasm32-wasi"
	],
	"ldflags": [
		"--stack-first", "--no-demangle",
		"/usr/lib/wasm32-wasi/libc.a",
		"/usr/lib/llvm-$LLVM/lib/clang/$LLVM/lib/wasi/libclang_rt.builtins-wasm32.a"
	],
	"extra-files": [
		"src/runtime/asm_tinygowasm.S",
		"src/runtime/gc_boehm.c"
	]
}
EOF

write_wrapper "$wrapper" "$root/build/tinygo" "$dir/wasip1.json" "$root" "$LLVM_BIN:$GOBIN_DIR"
run "$wrapper" version
smoke "$wrapper" || {
	say "the built TinyGo cannot build a wasip1 reactor; last lines of the log:"
	tail -n 40 "$LOG" >&2
	exit 1
}
"$wrapper" version >"$dir/ok"
cp "$LOG" "$dir/build.log"
note "built $(cat "$dir/ok") in $(($(date +%s) - started)) s"
echo "$wrapper"
