#!/bin/sh
# helm.sh prints, on stdout, the path of a helm binary for the chart tests
# (deploy/helm), and prints nothing else there.
#
#   WASMCSI_HELM=$(.ci/helm.sh)
#   WASMCSI_HELM=$WASMCSI_HELM go test ./deploy/
#
# The binary is Helm $HELM_VERSION built from the Go module proxy with
# `go install helm.sh/helm/v3/cmd/helm` (no download of release archives),
# cached under ${WASMCSI_HELM_CACHE:-/var/cache/wasmcsi}/helm-<version>; a
# second run only checks the cache. Helm's dependencies never reach the
# project's go.mod: the build runs outside the module (GOWORK=off, GOFLAGS
# without -mod). Quiet: progress goes to a log (and a line to stderr when
# it is a terminal); on failure the log's tail goes to stderr.
set -eu

HELM_VERSION=3.22.0
CACHE=${WASMCSI_HELM_CACHE:-/var/cache/wasmcsi}

say() { printf 'helm.sh: %s\n' "$*" >&2; }
note() { if [ -t 2 ]; then say "$*"; fi; }
die() {
	say "$*"
	exit 1
}

case $CACHE in
/*) ;;
*) CACHE=$(pwd)/$CACHE ;;
esac
dir=$CACHE/helm-$HELM_VERSION
helm=$dir/bin/helm

ready() {
	[ -f "$dir/ok" ] && [ -x "$helm" ] && "$helm" version --short 2>/dev/null | grep -q "^v$HELM_VERSION"
}

if ready; then
	echo "$helm"
	exit 0
fi

if command -v go >/dev/null 2>&1; then
	GO=$(command -v go)
elif [ -x /usr/local/go/bin/go ]; then
	GO=/usr/local/go/bin/go
else
	die "no Go toolchain: put go on PATH or install it at /usr/local/go"
fi

if ! mkdir -p "$CACHE" 2>/dev/null || [ ! -w "$CACHE" ]; then
	die "cannot write $CACHE; run as root or set WASMCSI_HELM_CACHE to a writable folder"
fi
# One builder at a time; whoever waited finds the work done.
if command -v flock >/dev/null 2>&1; then
	exec 9>"$CACHE/.helm.lock"
	flock 9
fi
if ready; then
	echo "$helm"
	exit 0
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/wasmcsi-helm.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
LOG=$TMP/log

note "building Helm $HELM_VERSION with $("$GO" env GOVERSION) in $dir (a few minutes)"
started=$(date +%s)
rm -rf "$dir"
mkdir -p "$dir/bin"
# Outside any module, so that go install takes helm's own go.mod as it is.
# The version is stamped as helm's release builds do.
if ! (cd "$TMP" && env GOWORK=off GOFLAGS=-buildvcs=false GOBIN="$dir/bin" CGO_ENABLED=0 \
	"$GO" install -trimpath \
	-ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=v$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
	"helm.sh/helm/v3/cmd/helm@v$HELM_VERSION") >"$LOG" 2>&1; then
	say "go install helm.sh/helm/v3/cmd/helm@v$HELM_VERSION failed; last lines of the log:"
	tail -n 40 "$LOG" >&2
	exit 1
fi
"$helm" version --short >"$dir/ok" 2>>"$LOG" || {
	tail -n 20 "$LOG" >&2
	die "the built helm does not run"
}
grep -q "^v$HELM_VERSION" "$dir/ok" || die "the built helm reports $(cat "$dir/ok"), want v$HELM_VERSION"
note "built $(cat "$dir/ok") in $(($(date +%s) - started)) s"
echo "$helm"
