#!/bin/bash
# test.sh - run the privileged tests (*_vm_test.go) of the given packages in one VM guest.
# Usage: bash .ci/vm/test.sh [./pkg/path ...]   (default: every package with a *_vm_test.go file)
#
# Each package is built as a static test binary (CGO_ENABLED=0 go test -c),
# copied with its testdata/ into a guest booted by .ci/vm/run.sh, and run
# there as root with -test.v and WASMCSI_VM=1, one after another. Each
# binary's output, exit code and wall time come back to bin/vm-results/
# (<name>.out, <name>.rc), and a summary is printed. Exit status is non-zero
# when any binary failed or the guest never reported.
#
# Env: VM_FILES      folder whose files (e.g. built .wasm modules) are copied
#                    into the guest; tests find them at $WASMCSI_MODULE_DIR.
#                    Unset: every examples/<name> module is built here and
#                    copied in (<name>.wasm; <name>.tinygo.wasm too when
#                    WASMCSI_TINYGO names a tinygo, see .ci/tinygo.sh)
#      VM_TEST_ARGS  extra arguments for every test binary (e.g. -test.run=Thin)
#      VM_ENV        NAME=value words exported to the test binaries in the guest
#      VM_TIMEOUT    time limit for the guest run in seconds (default 5400:
#                    the tier runs csi-sanity against six backends and the
#                    kill tests under emulation; its guest clock also runs
#                    fast when the host is loaded)
#      VM_MEM        guest memory in MiB (default 2048, at most 2048)
#      WASMCSI_VM_CACHE  where run.sh keeps the kernel, image and jobs
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
RESULTS=$ROOT/bin/vm-results
CACHE=${WASMCSI_VM_CACHE:-/var/tmp/wasmcsi-vm}
log() { printf '[test-vm] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

command -v go >/dev/null || die "go is not on PATH"
PKGS=("$@")
if [ ${#PKGS[@]} -eq 0 ]; then
  mapfile -t PKGS < <(find . -name '*_vm_test.go' -not -path './bin/*' -not -path './.git/*' -printf '%h\n' | sort -u)
fi
[ ${#PKGS[@]} -gt 0 ] || { log "no package has a *_vm_test.go file; nothing to run"; exit 0; }

mkdir -p "$CACHE/jobs"
JOB=$(mktemp -d "$CACHE/jobs/test.XXXXXX")
trap 'rm -rf "$JOB"' EXIT
STAGE=$JOB/files
mkdir -p "$STAGE/pkgs" "$RESULTS"
rm -f "$RESULTS"/*.out "$RESULTS"/*.rc "$RESULTS"/console.log "$RESULTS"/summary.txt

# ------------------------------------------------------------------ build
NAMES=()
T_BUILD=$SECONDS
for pkg in "${PKGS[@]}"; do
  pkg=./${pkg#./}; pkg=${pkg%/}
  name=$(printf '%s' "${pkg#./}" | tr '/' '-')
  [ -n "$name" ] && [ "$name" != . ] || name=root
  mkdir -p "$STAGE/pkgs/$name"
  log "building $pkg"
  # Built in its own module's folder (the nearest go.mod above it): the
  # repository holds several modules (see the Makefile's GOMODS).
  mod=$pkg
  while [ ! -f "$mod/go.mod" ]; do mod=$(dirname "$mod"); done
  rel=${pkg#"$mod"}; rel=./${rel#/}
  (cd "$mod" && CGO_ENABLED=0 go test -c -o "$STAGE/pkgs/$name/$name.test" "$rel") || die "go test -c $pkg failed"
  if [ ! -f "$STAGE/pkgs/$name/$name.test" ]; then
    log "$pkg has no tests; skipped"; rm -rf "${STAGE:?}/pkgs/$name"; continue
  fi
  [ -d "$pkg/testdata" ] && cp -a "$pkg/testdata" "$STAGE/pkgs/$name/"
  NAMES+=("$name")
done
[ ${#NAMES[@]} -gt 0 ] || { log "no test binaries; nothing to run"; exit 0; }
if [ -n "${VM_FILES:-}" ]; then
  [ -d "$VM_FILES" ] || die "VM_FILES=$VM_FILES is not a folder"
  mkdir -p "$STAGE/modules"; cp -a "$VM_FILES"/. "$STAGE/modules/"
else
  # The guest has no toolchain: build the example modules here, as the
  # Makefile does (<name>.wasm, and <name>.tinygo.wasm when WASMCSI_TINYGO
  # names a tinygo). A module that does not build is reported and left
  # out; the tests that need it skip with the reason.
  mkdir -p "$STAGE/modules"
  for dir in examples/*/; do
    name=$(basename "$dir")
    compgen -G "$dir*.go" >/dev/null || continue
    if ! GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 go build -buildmode=c-shared -trimpath \
        -o "$STAGE/modules/$name.wasm" "./$dir" 2>"$JOB/build.log"; then
      log "warning: module $name does not build; tests that need it will skip: $(tail -n 3 "$JOB/build.log")"
      continue
    fi
    if [ -n "${WASMCSI_TINYGO:-}" ] && ! "$WASMCSI_TINYGO" build -buildmode=c-shared -scheduler=none -no-debug \
        -o "$STAGE/modules/$name.tinygo.wasm" "./$dir" 2>"$JOB/build.log"; then
      log "warning: TinyGo cannot build module $name: $(tail -n 3 "$JOB/build.log")"
    fi
  done
  log "built modules: $(cd "$STAGE/modules" && echo *.wasm)"
fi
# Tests that run the daemon as a program (host/internal/daemontest) find
# it at $WASMCSI_TEST_DAEMON: the guest cannot build it.
(CGO_ENABLED=0 go build -trimpath -o "$STAGE/wasmcsi" ./cmd/wasmcsi) || die "go build ./cmd/wasmcsi failed"
log "built ${#NAMES[@]} test binaries and the daemon in $((SECONDS - T_BUILD)) s"

# ------------------------------------------------------------------ guest script
# Runs every binary from its package folder (so testdata/ resolves), with
# its output on the console and in /job/results.
cat >"$JOB/guest.sh" <<EOF
#!/bin/sh
export WASMCSI_VM=1 GOTRACEBACK=all
[ -d /job/files/modules ] && export WASMCSI_MODULE_DIR=/job/files/modules
export WASMCSI_TEST_DAEMON=/job/files/wasmcsi ${VM_ENV:-}
mkdir -p /job/results
uptime() { read -r u _ </proc/uptime; echo "\$u"; }
fails=0
for dir in /job/files/pkgs/*/; do
  name=\$(basename "\$dir")
  echo "=== BINARY \$name"
  t0=\$(uptime)
  { cd "\$dir" && ./"\$name.test" -test.v -test.timeout=60m ${VM_TEST_ARGS:-} 2>&1; echo \$? >/tmp/rc.\$name; } | tee "/job/results/\$name.out"
  rc=\$(cat /tmp/rc.\$name)
  dt=\$(awk -v a="\$t0" -v b="\$(uptime)" 'BEGIN { printf "%.1f", b - a }')
  echo "\$rc \$dt" >"/job/results/\$name.rc"
  echo "=== BINARY \$name exit=\$rc time=\${dt}s"
  [ "\$rc" = 0 ] || fails=\$((fails + 1))
done
exit \$fails
EOF

# ------------------------------------------------------------------ run
T_RUN=$(date +%s.%N)
set +e
bash "$ROOT/.ci/vm/run.sh" -j "$JOB" -t "${VM_TIMEOUT:-5400}" -m "${VM_MEM:-2048}" --iscsid "$JOB/guest.sh"
VMRC=$?
set -e
WALL=$(awk -v a="$T_RUN" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
cp "$JOB/console.log" "$RESULTS/" 2>/dev/null || true
cp "$JOB"/results/* "$RESULTS/" 2>/dev/null || true

# ------------------------------------------------------------------ summary
# count RESULT FILE: how many tests and subtests of a -test.v output ended so.
count() { if [ -f "$2" ]; then grep -c -- "--- $1: " "$2" || true; else echo 0; fi; }
FAILED=0
SUMMARY=$(printf '%-6s %8s  %-28s %s' RESULT TIME BINARY TESTS)
for name in "${NAMES[@]}"; do
  out=$RESULTS/$name.out
  counts="pass $(count PASS "$out"), fail $(count FAIL "$out"), skip $(count SKIP "$out")"
  if [ -f "$RESULTS/$name.rc" ]; then
    read -r rc dt <"$RESULTS/$name.rc"
    if [ "$rc" = 0 ]; then res=PASS; else res=FAIL; FAILED=$((FAILED + 1)); fi
    SUMMARY+=$'\n'$(printf '%-6s %7ss  %-28s %s' "$res" "$dt" "$name" "$counts")
  else
    FAILED=$((FAILED + 1))
    SUMMARY+=$'\n'$(printf '%-6s %8s  %-28s %s' NONE - "$name" "never reported (guest exit $VMRC)")
  fi
done
SUMMARY+=$'\n'$(printf 'guest wall time %ss (boot + tests), guest exit %d' "$WALL" "$VMRC")
printf '%s\n' "$SUMMARY" | tee "$RESULTS/summary.txt"
# failures NAME: the failed tests of one output, with the lines that say
# why (ginkgo's failure blocks, the log lines just before a "--- FAIL"), so
# that the end of the run explains a failure without the whole output.
failures() {
  sed 's/\x1b\[[0-9;]*m//g' "$RESULTS/$1.out" | awk '
    /^• \[(FAILED|PANICKED|TIMEDOUT)\]/ { inblk = 1; n = 0 }
    inblk { if (n++ < 60) print; if (/^----------+$/ && n > 1) { inblk = 0; print "" } ; next }
    { ring[NR % 25] = $0 }
    /^ *--- FAIL: / {
      for (i = NR - 24; i < NR; i++) if (i > 0 && (i % 25) in ring) print ring[i % 25]
      print; print ""
    }' | head -400
}
if [ "$FAILED" -gt 0 ] || [ "$VMRC" != 0 ]; then
  for name in "${NAMES[@]}"; do
    if [ -f "$RESULTS/$name.rc" ] && [ "$(cut -d' ' -f1 "$RESULTS/$name.rc")" = 0 ]; then continue; fi
    [ -f "$RESULTS/$name.out" ] || continue
    printf '\n=== why %s failed (from bin/vm-results/%s.out)\n' "$name" "$name"
    failures "$name"
  done
  log "FAILED: $FAILED of ${#NAMES[@]} binaries; outputs in bin/vm-results/"
  exit 1
fi
log "all ${#NAMES[@]} binaries passed; outputs in bin/vm-results/"
