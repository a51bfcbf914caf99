#!/usr/bin/env bash
# csi-sanity the way a user runs it: the csi-sanity binary of csi-test
# (built from the Go module proxy at a pinned version) against the daemon as
# `make run` starts it — bin/wasmcsi serve with the embedded configuration
# and every example module — once per backend and access type.
#
# The daemon runs in a temporary folder of its own (socket, records, pools,
# compilation cache: the embedded configuration's relative paths land
# there), so it collides neither with `make run` nor with another run of
# this script. The one global name the embedded configuration has, the
# dmthin pool's device-mapper name, gets a suffix of this run. Whatever the
# run leaves (the daemon, mounts, device-mapper devices, loop devices on its
# files) is torn down on every exit, also on failure or interrupt.
#
# Prints passed/failed/pending/skipped per target and exits non-zero when
# any spec failed, a run did not finish, or the teardown left something.
# Needs root (mounts, loop devices); without it, it says so and skips.
#
#   bash .ci/sanity.sh              (or: make sanity)
#   SANITY_TARGETS="localdir/mount" bash .ci/sanity.sh
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
GO=${GO:-go}
CSI_TEST_VERSION=v5.6.0
targets=${SANITY_TARGETS:-"localdir/mount loopfile/mount loopfile/block"}

if [ "$(id -u)" != 0 ]; then
  echo "sanity: skipped: csi-sanity against make run needs root (mounts, loop devices)"
  exit 0
fi

tools=$repo/bin/tools/csi-test-$CSI_TEST_VERSION
logs=$repo/bin/sanity
mkdir -p "$tools" "$logs"
echo "sanity: csi-sanity $CSI_TEST_VERSION from the module proxy"
GOBIN=$tools "$GO" install "github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity@$CSI_TEST_VERSION"
sanity=$tools/csi-sanity
echo "sanity: make build"
make -s build GO="$GO"

work=$(mktemp -d "${TMPDIR:-/tmp}/wasmcsi-sanity.XXXXXX")
sock=$work/run/csi.sock
daemon=""

. .ci/work.sh

# remove_holders removes the device-mapper devices stacked on a block
# device (sysfs name), top first: thin volumes before their pool.
remove_holders() {
  local h name
  for h in /sys/block/"$1"/holders/*; do
    [ -e "$h" ] || continue
    h=$(basename "$h")
    remove_holders "$h"
    name=$(cat "/sys/block/$h/dm/name" 2>/dev/null || echo "$h")
    if command -v dmsetup >/dev/null; then
      dmsetup remove --retry "$name" || echo "sanity: teardown: dmsetup remove $name failed" >&2
    else
      echo "sanity: teardown: $name holds $1 and dmsetup is not installed" >&2
    fi
  done
}

teardown() {
  local rc=$? m l left=0
  trap - EXIT INT TERM
  if [ -n "$daemon" ] && kill -0 "$daemon" 2>/dev/null; then
    kill -TERM "$daemon" 2>/dev/null || true
    for _ in $(seq 150); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$daemon" 2>/dev/null || true
    wait "$daemon" 2>/dev/null || true
  fi
  for m in $(mounts_under); do
    umount "$m" 2>/dev/null || umount -l "$m" || echo "sanity: teardown: cannot unmount $m" >&2
  done
  for l in $(loops_on_work); do
    remove_holders "$(basename "$l")"
    losetup -d "$l" || echo "sanity: teardown: cannot detach $l" >&2
  done
  if [ -n "$(mounts_under)" ] || [ -n "$(loops_on_work)" ]; then
    echo "sanity: teardown left mounts or loop devices under $work:" >&2
    mounts_under >&2
    loops_on_work >&2
    left=1
  else
    # Never through a mount: only once nothing is mounted below it.
    rm -rf --one-file-system "$work"
  fi
  [ "$left" = 0 ] || rc=1
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

echo "sanity: starting bin/wasmcsi serve in $work (log: $logs/daemon.log)"
(
  cd "$work"
  export WASMCSI_MODULES__DMTHIN__CONFIG__POOL="wasmcsi-thin-sanity-$$"
  unset CSI_ENDPOINT
  exec "$repo/bin/wasmcsi" serve --module_dir "$repo/bin/modules"
) >"$logs/daemon.log" 2>&1 &
daemon=$!
for _ in $(seq 600); do
  [ -S "$sock" ] && break
  if ! kill -0 "$daemon" 2>/dev/null; then
    echo "sanity: the daemon exited before serving:" >&2
    tail -20 "$logs/daemon.log" >&2
    exit 1
  fi
  sleep 0.2
done
if [ ! -S "$sock" ]; then
  echo "sanity: the daemon did not serve $sock within 120 s" >&2
  tail -20 "$logs/daemon.log" >&2
  exit 1
fi
grep -m1 'serving CSI' "$logs/daemon.log" || true

declare -A size=([localdir]=0 [loopfile]=$((16 << 20)))
failed=0
summary=()
for tg in $targets; do
  backend=${tg%/*} access=${tg#*/}
  log=$logs/$backend-$access.log
  params=$work/params-$backend.yaml
  printf 'wasmcsi.dev/backend: %s\n' "$backend" >"$params"
  args=(
    --csi.endpoint "$sock"
    --csi.mountdir "$work/$backend-$access-target"
    --csi.stagingdir "$work/$backend-$access-staging"
    --csi.testvolumeparameters "$params"
    --csi.testvolumeaccesstype "$access"
    --ginkgo.no-color
  )
  if [ "${size[$backend]:-0}" -gt 0 ]; then
    args+=(--csi.testvolumesize "${size[$backend]}" --csi.testvolumeexpandsize $((2 * size[$backend])))
  fi
  echo "sanity: $backend/$access (log: $log)"
  rc=0
  "$sanity" "${args[@]}" >"$log" 2>&1 || rc=$?
  # Ginkgo's summary: "SUCCESS! -- 92 Passed | 0 Failed | 1 Pending | 10 Skipped"
  line=$(grep -E '[0-9]+ Passed \| [0-9]+ Failed \| [0-9]+ Pending \| [0-9]+ Skipped' "$log" | tail -1 || true)
  if [ -z "$line" ]; then
    summary+=("$(printf '%-10s %-6s %s' "$backend" "$access" "did not finish (exit $rc)")")
    tail -20 "$log" >&2
    failed=1
    continue
  fi
  read -r p f pe s < <(echo "$line" | grep -oE '[0-9]+ (Passed|Failed|Pending|Skipped)' | awk '{printf "%s ", $1} END {print ""}')
  summary+=("$(printf '%-10s %-6s %6s %6s %7s %7s' "$backend" "$access" "$p" "$f" "$pe" "$s")")
  if [ "$f" != 0 ] || [ "$rc" != 0 ]; then
    grep -E '^\s*\[FAIL\]' "$log" | sort -u >&2 || true
    failed=1
  fi
done

echo
echo "csi-sanity $CSI_TEST_VERSION against bin/wasmcsi serve (embedded configuration)"
printf '%-10s %-6s %6s %6s %7s %7s\n' backend access passed failed pending skipped
printf '%s\n' "${summary[@]}"
[ "$failed" = 0 ] || { echo "sanity: FAILED" >&2; exit 1; }
echo "sanity: ok"
