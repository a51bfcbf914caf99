#!/usr/bin/env bash
# The Nomad tier: a real Nomad dev agent runs wasmcsi from
# deploy/nomad/wasmcsi-raw.nomad.hcl (raw_exec, monolith plugin) with the
# locally built bin/wasmcsi and bin/modules, and the `nomad volume` CLI and
# `exec` consumer jobs drive it, once per backend (localdir, loopfile):
# create, write and read back across jobs, snapshot, restore, clone,
# expansion while claimed and while unclaimed, read-only, block (loopfile;
# checked from the host, because exec's device cgroup denies the task the
# device), kill -9 of the daemon with a consumer writing, a plugin stop/start
# around a consumer stop (Nomad's own retry cleans up) and around a purged
# consumer (the documented recovery), delete, and that nothing is left
# (mount, loop device, pool entry).
#
# Nomad is built from the Go module proxy once per version (build.sh,
# cached under $NOMAD_CACHE). Everything else lives in a temporary folder,
# torn down on every exit, also on failure: jobs stopped, agent stopped,
# mounts below the folder unmounted, loop devices on its files detached,
# processes started from it killed.
#
# Prints each step's result per backend and exits non-zero when a step
# failed or the teardown left something. Skips with the reason without root,
# the Go module proxy or a tool it needs (jq, util-linux); NOMAD_REQUIRE=1
# makes that a failure.
#
#   bash .ci/nomad/test.sh            (or: make test-nomad)
#   NOMAD_BACKENDS=loopfile bash .ci/nomad/test.sh
#   NOMAD_STEPS="create write-read" bash .ci/nomad/test.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
GO=${GO:-go}
export NOMAD_VERSION=${NOMAD_VERSION:-1.11.3}
backends=${NOMAD_BACKENDS:-"localdir loopfile"}
# NOMAD_STEPS="create write-read" runs only those steps (later steps need
# the earlier ones' volumes).
only=${NOMAD_STEPS:-}
port=${NOMAD_TIER_PORT:-24646}
t0=$(date +%s)

say() { echo "nomad-tier: $*"; }
# skip REASON: exits 0, or 1 with NOMAD_REQUIRE set (CI, where a skip would
# hide that the tier did not run).
skip() {
	if [ -n "${NOMAD_REQUIRE:-}" ]; then
		say "FAILED (NOMAD_REQUIRE is set): $*"
		exit 1
	fi
	say "skipped: $*"
	exit 0
}

[ "$(id -u)" = 0 ] || skip "the plugin mounts and attaches loop devices (needs root)"
command -v "$GO" >/dev/null || skip "no Go toolchain ($GO) to build Nomad and wasmcsi"
"$GO" mod download -json "github.com/hashicorp/nomad@v$NOMAD_VERSION" >/dev/null 2>&1 ||
	skip "the Go module proxy does not serve github.com/hashicorp/nomad@v$NOMAD_VERSION"
for tool in jq losetup findmnt mountpoint ldd; do
	command -v "$tool" >/dev/null || skip "$tool is not installed"
done

work=$(mktemp -d "${TMPDIR:-/tmp}/wasmcsi-nomad.XXXXXX")
logs=${NOMAD_TIER_LOGS:-$repo/bin/nomad-tier}
rm -rf "$logs"
mkdir -p "$logs" "$work/jobs" "$work/vars"
ndata=$work/nomad
root=$work/wasmcsi
node=wasmcsi-tier
plugin=wasmcsi-$node
export NOMAD_ADDR=http://127.0.0.1:$port
agent=""
nomad=""

# Build Nomad (cached after the first run) while the daemon builds.
say "nomad v$NOMAD_VERSION: build or cache (log: $logs/build.log)"
GO=$GO bash .ci/nomad/build.sh >"$work/nomad.path" 2>"$logs/build.log" &
builder=$!
say "make build"
make -s build GO="$GO" || { say "FAILED: make build"; exit 1; }
wait "$builder" || { say "FAILED: nomad build:"; tail -20 "$logs/build.log"; exit 1; }
nomad=$(cat "$work/nomad.path")
# The plugin runs copies: a rebuild of bin/ during the run changes nothing.
mkdir -p "$work/bin/modules"
cp bin/wasmcsi "$work/bin/"
cp bin/modules/*.wasm "$work/bin/modules/"
t_built=$(date +%s)
say "built in $((t_built - t0)) s: $nomad"

. .ci/work.sh

# procs_of_work lists processes whose command line names $work (the plugin
# task, consumers' executors) other than this script and the agent.
procs_of_work() {
	local p
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[ "$p" = $$ ] && continue
		tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF "$work" && echo "$p"
	done
}

# daemon_pid is the wasmcsi serving the plugin task of this agent.
daemon_pid() {
	local p
	for p in /proc/[0-9]*; do
		[ "$(readlink "$p/exe" 2>/dev/null)" = "$work/bin/wasmcsi" ] || continue
		tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF "$ndata" && echo "${p#/proc/}"
	done
}

teardown() {
	local rc=$? m l p left=0 j
	# A second Ctrl-C or TERM must not cut the cleanup short.
	trap - EXIT
	trap '' INT TERM
	if [ -n "$agent" ] && kill -0 "$agent" 2>/dev/null; then
		# Consumers first, while the plugin can still unpublish; then the plugin.
		for j in $("$nomad" job status -short 2>/dev/null | awk 'NR > 1 && $1 != "'"$plugin"'" { print $1 }'); do
			"$nomad" job stop -purge -detach "$j" >/dev/null 2>&1 || true
		done
		sleep 3
		"$nomad" job stop -purge -detach "$plugin" >/dev/null 2>&1 || true
		sleep 2
		kill -INT "$agent" 2>/dev/null || true
		for _ in $(seq 150); do kill -0 "$agent" 2>/dev/null || break; sleep 0.2; done
		kill -KILL "$agent" 2>/dev/null || true
		wait "$agent" 2>/dev/null || true
	fi
	for p in $(procs_of_work); do kill -KILL "$p" 2>/dev/null || true; done
	for m in $(mounts_under); do
		umount "$m" 2>/dev/null || umount -l "$m" || echo "nomad-tier: teardown: cannot unmount $m" >&2
	done
	for l in $(loops_on_work); do
		losetup -d "$l" || echo "nomad-tier: teardown: cannot detach $l" >&2
	done
	if [ -n "$(mounts_under)" ] || [ -n "$(loops_on_work)" ] || [ -n "$(procs_of_work)" ]; then
		echo "nomad-tier: teardown left mounts, loop devices or processes of $work:" >&2
		mounts_under >&2
		loops_on_work >&2
		procs_of_work >&2
		left=1
	else
		rm -rf --one-file-system "$work"
	fi
	[ "$left" = 0 ] || rc=1
	say "total $(($(date +%s) - t0)) s"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

api() { "$nomad" operator api "$@"; }

# waitfor SECONDS WHAT CMD...: polls CMD every second until it succeeds.
waitfor() {
	local n=$1 what=$2 i
	shift 2
	for ((i = 0; i < n; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
	done
	echo "timed out after $n s waiting for $what" >&2
	return 1
}

# The consumers' root: only the tools their scripts use, with the
# libraries ldd names. The exec driver links or copies the client's
# chroot_env into every task's folder; its default (all of /usr, /lib,
# /etc, ...) took ~30 s per consumer here, the larger part of each step.
chroot=$work/chroot
mkdir -p "$chroot/bin"
for tool in sh cat cut df ls md5sum mkdir seq sleep sync tail; do
	p=$(command -v "$tool") || { say "FAILED: $tool, which the consumers use, is not installed"; exit 1; }
	cp -L "$p" "$chroot/bin/$tool"
	for lib in $(ldd "$p" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'); do
		mkdir -p "$chroot$(dirname "$lib")"
		cp -Ln "$lib" "$chroot$lib"
	done
done
chroot_env=$(for d in "$chroot"/*; do printf '    "%s" = "/%s"\n' "$d" "${d##*/}"; done)

cat >"$work/agent.hcl" <<EOF
name      = "$node"
data_dir  = "$ndata"
bind_addr = "127.0.0.1"
ports {
  http = $port
  rpc  = $((port + 1))
  serf = $((port + 2))
}
client {
  options = {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
  chroot_env {
$chroot_env
  }
}
plugin "raw_exec" {
  config {
    enabled = true
  }
}
EOF
say "starting the dev agent on $NOMAD_ADDR (log: $logs/agent.log)"
"$nomad" agent -dev -config "$work/agent.hcl" >"$logs/agent.log" 2>&1 &
agent=$!
node_ready() { [ "$(api /v1/nodes | jq -r '.[0].Status')" = ready ]; }
waitfor 120 "the client to be ready" node_ready || { tail -20 "$logs/agent.log"; exit 1; }

# The plugin, exactly as deploy/nomad ships it, with this tree's binaries.
plugin_vars=(-var "node=$node" -var "nomad_data_dir=$ndata" -var "wasmcsi=$work/bin/wasmcsi"
	-var "module_dir=$work/bin/modules" -var "root=$root")
plugin_healthy() {
	api "/v1/plugin/csi/$plugin" | jq -e '.ControllersHealthy == 1 and .NodesHealthy == 1' >/dev/null
}
start_plugin() {
	"$nomad" job run -detach "${plugin_vars[@]}" deploy/nomad/wasmcsi-raw.nomad.hcl >/dev/null &&
		waitfor 120 "plugin $plugin to be healthy" plugin_healthy
}
say "running deploy/nomad/wasmcsi-raw.nomad.hcl as $plugin"
start_plugin || exit 1
t_up=$(date +%s)
say "agent and plugin up in $((t_up - t_built)) s"

# --- helpers for volumes and consumer jobs ---

# volspec ID BACKEND CAPACITY [ATTACHMENT [EXTRA]] writes a volume spec.
volspec() {
	local id=$1 b=$2 cap=$3 att=${4:-file-system} extra=${5:-} ro=""
	# Always a mount_options block: Nomad stores an empty one for a volume
	# created without, and refuses a later update (an expansion) of a volume
	# in use whose spec has none ("can not update mount options").
	local mo='mount_options {}'
	[ "$b" = loopfile ] && [ "$att" = file-system ] && mo='mount_options { fs_type = "xfs" }'
	[ "$att" = file-system ] && ro='capability {
  access_mode     = "single-node-reader-only"
  attachment_mode = "file-system"
}'
	cat >"$work/jobs/vol-$id.hcl" <<EOF
id           = "$id"
name         = "$id"
type         = "csi"
plugin_id    = "$plugin"
capacity_min = "$cap"
capability {
  access_mode     = "single-node-writer"
  attachment_mode = "$att"
}
$ro
$mo
parameters {
  "wasmcsi.dev/backend" = "$b"
}
$extra
EOF
	echo "$work/jobs/vol-$id.hcl"
}

# consumer NAME TYPE VOLUME SCRIPT [READONLY [ATTACHMENT]] writes and runs an
# exec job whose task runs SCRIPT with the volume at /data.
consumer() {
	local name=$1 type=$2 vol=$3 script=$4 ro=${5:-false} att=${6:-file-system} f mode=single-node-writer
	[ "$ro" = true ] && mode=single-node-reader-only
	f=$work/jobs/$name.hcl
	cat >"$f" <<EOF
job "$name" {
  type        = "$type"
  datacenters = ["*"]
  group "g" {
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }
    volume "v" {
      type            = "csi"
      source          = "$vol"
      access_mode     = "$mode"
      attachment_mode = "$att"
      read_only       = $ro
    }
    task "t" {
      driver = "exec"
      config {
        command = "/bin/sh"
        args    = ["-c", <<EOT
$script
EOT
        ]
      }
      volume_mount {
        volume      = "v"
        destination = "/data"
        read_only   = $ro
      }
      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
EOF
	"$nomad" job run -detach "$f" >/dev/null
}

alloc_of() { api "/v1/job/$1/allocations" | jq -r 'sort_by(.CreateIndex) | last | .ID // empty'; }
alloc_status() { api "/v1/job/$1/allocations" | jq -r 'sort_by(.CreateIndex) | last | .ClientStatus // empty'; }
is_running() { [ "$(alloc_status "$1")" = running ]; }
is_done() { case "$(alloc_status "$1")" in complete | failed | lost) return 0 ;; esac; return 1; }

# batch NAME VOLUME SCRIPT [READONLY [ATTACHMENT]]: runs SCRIPT to its end,
# prints its output and succeeds when it exited 0.
batch() {
	local name=$1 a st
	consumer "$1" batch "$2" "$3" "${4:-false}" "${5:-file-system}" || return 1
	waitfor 180 "job $name to finish" is_done "$name" || return 1
	a=$(alloc_of "$name")
	st=$(alloc_status "$name")
	"$nomad" alloc logs "$a" t 2>/dev/null
	"$nomad" alloc logs -stderr "$a" t 2>/dev/null >&2
	"$nomad" job stop -purge -detach "$name" >/dev/null 2>&1
	[ "$st" = complete ] || { echo "job $name: $st" >&2; api "/v1/allocation/$a" | jq -c '.TaskStates.t.Events[] | .DisplayMessage' >&2; return 1; }
}

# service NAME VOLUME SCRIPT [READONLY [ATTACHMENT]]: starts a job that keeps
# running and waits until it does.
service() {
	consumer "$1" service "$2" "$3" "${4:-false}" "${5:-file-system}" &&
		waitfor 180 "job $1 to run" is_running "$1" || {
		api "/v1/allocation/$(alloc_of "$1")" | jq -c '.TaskStates.t.Events[]? | .DisplayMessage' >&2
		return 1
	}
}

# unclaimed VOLUME: Nomad released every claim on it and the node let it go
# (no staging or publish mount left). The server can list a claim as
# released while the client's unstage still runs; a job started then finds
# the volume staged and Nomad publishes it without staging again, so a step
# that needs a fresh stage (growth at stage) would race.
unclaimed() {
	api "/v1/volume/csi/$1" | jq -e '(.ReadAllocs | length) == 0 and (.WriteAllocs | length) == 0 and ((.PastClaims // {}) | length) == 0' >/dev/null &&
		! mounted_vol "$1"
}
stop_job() {
	"$nomad" job stop -purge -detach "$1" >/dev/null 2>&1
	waitfor 120 "volume $2 to be released" unclaimed "$2"
}

# pubpath VOLUME JOB: the host path of VOLUME's publication to JOB's allocation.
pubpath() {
	find "$ndata/client/csi/monolith/$plugin/per-alloc/$(alloc_of "$2")/$1" -mindepth 1 -maxdepth 1 2>/dev/null | head -1
}
mounted_vol() { grep -F "/$1/" /proc/self/mountinfo | grep -qF "$ndata/client/csi/monolith/$plugin/"; }
not_mounted_vol() { ! mounted_vol "$1"; }
# no_loop_of VOLUME: no loop device is attached to VOLUME's backing file.
no_loop_of() {
	local id l
	id=$(api "/v1/volume/csi/$1" | jq -r .ExternalID)
	id=${id#*:}
	for l in $(loops_on_work); do
		if grep -qF "/$id" "/sys/block/${l#/dev/}/loop/backing_file"; then
			echo "loop device $l still attached to $1"
			return 1
		fi
	done
}
fs_size() { df -B1 --output=size "$1" | tail -1 | tr -d ' '; }
vol_capacity() { api "/v1/volume/csi/$1" | jq -r '.Capacity'; }

# --- the steps ---

declare -a results=()
failed=0
# step BACKEND NAME FUNCTION: runs FUNCTION with errexit, records the result.
step() {
	local b=$1 name=$2 fn=$3 s rc
	if [ -n "$only" ] && [[ " $only " != *" $name "* ]]; then
		return 0
	fi
	s=$(date +%s)
	say "[$b] $name"
	(set -e; "$fn" "$b") >"$logs/$b-$name.log" 2>&1
	rc=$?
	if [ "$rc" = 0 ]; then
		results+=("$(printf '%-9s %-22s %-4s %4d s' "$b" "$name" PASS $(($(date +%s) - s)))")
	else
		results+=("$(printf '%-9s %-22s %-4s %4d s' "$b" "$name" FAIL $(($(date +%s) - s)))")
		failed=1
		sed 's/^/    /' "$logs/$b-$name.log" | tail -15
	fi
	return "$rc"
}

# Sizes: xfs (loopfile) wants 300 MiB at least.
cap0=320MiB
cap1=400MiB
cap2=480MiB
cap3=512MiB
mib() { echo $(($1 << 20)); }

s_create() {
	"$nomad" volume create "$(volspec "v-$1" "$1" $cap0)"
	api "/v1/volume/csi/v-$1" | jq -e '.Schedulable' >/dev/null
}

s_write_read() {
	batch "w-$1" "v-$1" 'set -e; echo hello-v > /data/hello; mkdir -p /data/d; seq 1 10000 > /data/d/seq; sync'
	waitfor 120 "v-$1 released" unclaimed "v-$1"
	out=$(batch "r-$1" "v-$1" 'set -e; cat /data/hello; md5sum /data/d/seq | cut -c1-32; df -k /data | tail -1')
	echo "$out"
	[ "$(echo "$out" | head -1)" = hello-v ]
	[ "$(echo "$out" | sed -n 2p)" = "$(seq 1 10000 | md5sum | cut -c1-32)" ]
	echo "$out" | tail -1 | awk '{print $2}' >"$work/vars/kb0-$1"
	waitfor 120 "v-$1 released" unclaimed "v-$1"
}

s_snapshot() {
	"$nomad" volume snapshot create "v-$1" "s-$1" | tee "$work/vars/snap-$1.out"
	awk 'NR == 2 { print $1 }' "$work/vars/snap-$1.out" >"$work/vars/snap-$1"
	[ -s "$work/vars/snap-$1" ]
	"$nomad" volume snapshot list -plugin "$plugin" | grep -F "$(cat "$work/vars/snap-$1")"
	echo "snapshot id $(cat "$work/vars/snap-$1")"
	# A write after the snapshot must not show in the restore.
	batch "w2-$1" "v-$1" 'set -e; echo after > /data/hello; sync'
	waitfor 120 "v-$1 released" unclaimed "v-$1"
}

s_restore() {
	# Larger than the source: NodeStage grows the restored filesystem.
	"$nomad" volume create "$(volspec "r-$1" "$1" $cap1 file-system "snapshot_id = \"$(cat "$work/vars/snap-$1")\"")"
	out=$(batch "rr-$1" "r-$1" 'set -e; cat /data/hello; md5sum /data/d/seq | cut -c1-32; df -k /data | tail -1')
	echo "$out"
	[ "$(echo "$out" | head -1)" = hello-v ]
	[ "$(echo "$out" | sed -n 2p)" = "$(seq 1 10000 | md5sum | cut -c1-32)" ]
	if [ "$1" = loopfile ]; then
		kb=$(echo "$out" | tail -1 | awk '{print $2}')
		# 80 MiB more device than the source: the filesystem must have grown.
		[ "$kb" -gt $(($(cat "$work/vars/kb0-$1") + 70 * 1024)) ] || { echo "restored fs is $kb KiB, source $(cat "$work/vars/kb0-$1") KiB: not grown to the larger volume"; exit 1; }
	fi
	waitfor 120 "r-$1 released" unclaimed "r-$1"
}

s_clone() {
	# clone_id, like snapshot_id, is the plugin's (external) volume ID.
	src=$(api "/v1/volume/csi/v-$1" | jq -r .ExternalID)
	"$nomad" volume create "$(volspec "c-$1" "$1" $cap0 file-system "clone_id = \"$src\"")"
	out=$(batch "rc-$1" "c-$1" 'set -e; cat /data/hello; md5sum /data/d/seq | cut -c1-32')
	echo "$out"
	[ "$(echo "$out" | head -1)" = after ]
	waitfor 120 "c-$1 released" unclaimed "c-$1"
}

s_expand_online() {
	service "h-$1" "v-$1" 'while :; do sleep 1; done'
	p=$(pubpath "v-$1" "h-$1")
	echo "published at $p"
	before=$(fs_size "$p")
	"$nomad" volume create "$(volspec "v-$1" "$1" $cap1)"
	[ "$(vol_capacity "v-$1")" -ge "$(mib 400)" ]
	if [ "$1" = loopfile ]; then
		grown() { [ "$(fs_size "$p")" -gt $((before + (60 << 20))) ]; }
		waitfor 60 "the mounted fs to grow" grown || { echo "fs still $(fs_size "$p") B (was $before B)"; exit 1; }
		echo "fs $before -> $(fs_size "$p") B while mounted"
		echo $(($(fs_size "$p") / 1024)) >"$work/vars/kb1-$1"
	fi
	stop_job "h-$1" "v-$1"
}

s_expand_unclaimed() {
	"$nomad" volume create "$(volspec "v-$1" "$1" $cap2)"
	[ "$(vol_capacity "v-$1")" -ge "$(mib 480)" ]
	out=$(batch "e-$1" "v-$1" 'set -e; cat /data/hello; df -k /data | tail -1')
	echo "$out"
	[ "$(echo "$out" | head -1)" = after ]
	if [ "$1" = loopfile ]; then
		kb=$(echo "$out" | tail -1 | awk '{print $2}')
		[ "$kb" -gt $(($(cat "$work/vars/kb1-$1") + 70 * 1024)) ] || { echo "fs after an unclaimed expansion is $kb KiB, before $(cat "$work/vars/kb1-$1") KiB: not grown"; exit 1; }
	fi
	waitfor 120 "v-$1 released" unclaimed "v-$1"
}

s_read_only() {
	out=$(batch "ro-$1" "v-$1" 'cat /data/hello; if echo x > /data/ro-write 2>/dev/null; then echo WRITABLE; else echo refused; fi' true)
	echo "$out"
	[ "$(echo "$out" | head -1)" = after ]
	[ "$(echo "$out" | tail -1)" = refused ]
	waitfor 120 "v-$1 released" unclaimed "v-$1"
}

s_block() {
	[ "$1" = loopfile ] || { echo "localdir has no block volumes"; return 0; }
	"$nomad" volume create "$(volspec "b-$1" "$1" 64MiB block-device)"
	# exec's device cgroup denies the task the device: the task only sees
	# that it is there; the host writes and reads through the publication.
	service "b1-$1" "b-$1" 'ls -l /data; while :; do sleep 1; done' false block-device
	p=$(pubpath "b-$1" "b1-$1")
	echo "published at $p"
	[ -b "$p" ]
	printf 'block-pattern-%s' "$1" | dd of="$p" bs=4096 conv=sync,fsync status=none
	stop_job "b1-$1" "b-$1"
	service "b2-$1" "b-$1" 'while :; do sleep 1; done' false block-device
	p=$(pubpath "b-$1" "b2-$1")
	[ -b "$p" ]
	got=$(dd if="$p" bs=4096 count=1 iflag=direct status=none | tr -d '\0')
	echo "read back: $got"
	[ "$got" = "block-pattern-$1" ]
	stop_job "b2-$1" "b-$1"
	"$nomad" volume delete "b-$1"
}

s_kill9() {
	service "k-$1" "v-$1" 'i=0; while :; do i=$((i+1)); echo $i >> /data/counter; sleep 0.5; done'
	p=$(pubpath "v-$1" "k-$1")
	pid=$(daemon_pid)
	[ -n "$pid" ] || { echo "no daemon of this agent's plugin is running"; exit 1; }
	echo "kill -9 $pid"
	kill -KILL "$pid"
	newpid() { q=$(daemon_pid); [ -n "$q" ] && [ "$q" != "$pid" ]; }
	waitfor 120 "a new daemon" newpid
	waitfor 120 "plugin healthy" plugin_healthy
	n1=$(wc -l <"$p/counter")
	sleep 3
	n2=$(wc -l <"$p/counter")
	echo "consumer wrote $n1 -> $n2 lines across the restart"
	[ "$n2" -gt "$n1" ]
	is_running "k-$1"
	stop_job "k-$1" "v-$1"
	waitfor 60 "v-$1 unmounted" not_mounted_vol "v-$1"
}

# The plugin stops while a consumer runs, the consumer stops, the plugin
# comes back. The Nomad client cannot unmount while the plugin is away; it
# retries (backoff doubling to 1 min, for as long as the stopped
# allocation exists on the client) and the server releases the claim at
# once. So the publication and the stage must go once the plugin is back,
# through Nomad's own retried NodeUnpublish and NodeUnstage, with nothing
# done by hand, and the data must be there afterwards. The stopped job is
# not purged before: a purge destroys the allocation and its retry with it
# (deploy/README.md, "Nomad").
s_plugin_restart() {
	service "p-$1" "v-$1" 'echo written-before-the-plugin-stopped > /data/p-mark; sync; while :; do sleep 1; done'
	p=$(pubpath "v-$1" "p-$1")
	echo "published at $p"
	[ -n "$p" ]
	"$nomad" job stop -detach "$plugin" >/dev/null
	plugin_gone() { [ -z "$(daemon_pid)" ]; }
	waitfor 60 "the plugin to stop" plugin_gone
	"$nomad" job stop -detach "p-$1" >/dev/null
	waitfor 120 "p-$1 to stop" is_done "p-$1"
	mountpoint -q "$p" || { echo "$p was unmounted while the plugin was down"; exit 1; }
	start_plugin
	# One retry interval (at most 1 min) after the plugin is healthy.
	target_gone() { ! mountpoint -q "$p"; }
	waitfor 150 "Nomad's retried unpublish of $p" target_gone
	waitfor 60 "v-$1 unstaged" not_mounted_vol "v-$1"
	waitfor 120 "v-$1 released" unclaimed "v-$1"
	"$nomad" job stop -purge -detach "p-$1" >/dev/null
	no_loop_of "v-$1"
	# The volume is usable again and holds what was written before.
	out=$(batch "pr-$1" "v-$1" 'cat /data/hello /data/p-mark')
	echo "$out"
	[ "$out" = "after
written-before-the-plugin-stopped" ]
	waitfor 120 "v-$1 released" unclaimed "v-$1"
	waitfor 60 "v-$1 unmounted" not_mounted_vol "v-$1"
	no_loop_of "v-$1"
}

# The same, but the stopped job is purged while the plugin is down: its
# allocation, and with it Nomad's retry, is gone, and nothing will ask the
# plugin to unpublish. The publication stays (wasmcsi cannot tell it from
# one in use). The operator recovers as deploy/README.md ("Nomad") says:
# unmount the target of the allocation that no longer exists, then run a
# job on the volume once; its stop unstages it.
s_purge_recovery() {
	service "q-$1" "v-$1" 'echo written-before-the-purge > /data/q-mark; sync; while :; do sleep 1; done'
	a=$(alloc_of "q-$1")
	p=$(pubpath "v-$1" "q-$1")
	echo "alloc $a published at $p"
	[ -n "$p" ]
	"$nomad" job stop -detach "$plugin" >/dev/null
	plugin_gone() { [ -z "$(daemon_pid)" ]; }
	waitfor 60 "the plugin to stop" plugin_gone
	"$nomad" job stop -purge -detach "q-$1" >/dev/null
	# Purged on the server, then destroyed on the client (its folder goes):
	# from then on no retry is left.
	alloc_gone() { ! "$nomad" alloc status "$a" >/dev/null 2>&1 && [ ! -d "$ndata/alloc/$a" ]; }
	waitfor 120 "alloc $a to be purged and destroyed" alloc_gone
	start_plugin
	sleep 5
	mountpoint -q "$p" || { echo "$p was unpublished after all: the purge did not leave it (update deploy/README.md)"; exit 1; }
	echo "after the purge $p stays mounted; the documented recovery:"
	# deploy/README.md: check that the allocation is gone, unmount its target.
	if "$nomad" alloc status "$a" >/dev/null 2>&1; then echo "alloc $a still exists"; exit 1; fi
	umount "$p"
	out=$(batch "qr-$1" "v-$1" 'cat /data/hello /data/q-mark')
	echo "$out"
	[ "$out" = "after
written-before-the-purge" ]
	waitfor 120 "v-$1 released" unclaimed "v-$1"
	waitfor 60 "v-$1 unstaged" not_mounted_vol "v-$1"
	no_loop_of "v-$1"
}

s_delete() {
	snap=$(cat "$work/vars/snap-$1")
	for v in "c-$1" "r-$1" "v-$1"; do
		"$nomad" volume delete "$v"
	done
	"$nomad" volume snapshot delete "$plugin" "$snap"
	[ "$(api "/v1/volumes?type=csi&plugin_id=$plugin" | jq '[.[] | select(.ID | endswith("-'"$1"'"))] | length')" = 0 ]
}

s_nothing_left() {
	if grep -F "$ndata/client/csi/monolith/$plugin/" /proc/self/mountinfo | grep -F -- "-$1/"; then
		echo "mounts left"; exit 1
	fi
	if grep -F "$root/pools/$1" /proc/self/mountinfo; then echo "pool mounts left"; exit 1; fi
	for l in $(loops_on_work); do
		if grep -qF "$root/pools/$1" "/sys/block/${l#/dev/}/loop/backing_file"; then
			echo "loop device left: $l"; exit 1
		fi
	done
	left=$(find "$root/pools/$1" -mindepth 1 -maxdepth 1 ! -name '.*' | head)
	[ -z "$left" ] || { echo "pool entries left: $left"; exit 1; }
	echo "pool $root/pools/$1: $(find "$root/pools/$1" -mindepth 1 | wc -l) entries (hidden bookkeeping only)"
	# The job grants dmthin too; without device-mapper it is refused
	# before it creates its pool files or attaches them.
	if [ ! -e /sys/class/misc/device-mapper ] && [ -d "$root/pools/dmthin" ]; then
		left=$(find "$root/pools/dmthin" -mindepth 1 | head)
		[ -z "$left" ] || { echo "dmthin, refused without device-mapper, left: $left"; exit 1; }
		echo "pool $root/pools/dmthin: empty (no device-mapper here)"
	fi
}

for b in $backends; do
	step "$b" create s_create
	[ "$?" = 0 ] || continue
	step "$b" write-read s_write_read
	step "$b" snapshot s_snapshot
	step "$b" restore s_restore
	step "$b" clone s_clone
	step "$b" expand-online s_expand_online
	step "$b" expand-unclaimed s_expand_unclaimed
	step "$b" read-only s_read_only
	step "$b" block s_block
	step "$b" kill-9 s_kill9
	step "$b" plugin-stop-start s_plugin_restart
	step "$b" purge-recovery s_purge_recovery
	step "$b" delete s_delete
	step "$b" nothing-left s_nothing_left
done

echo
say "Nomad v$NOMAD_VERSION, deploy/nomad/wasmcsi-raw.nomad.hcl (build $((t_built - t0)) s, up $((t_up - t_built)) s, steps $(($(date +%s) - t_up)) s)"
printf '%s\n' "${results[@]}"
[ "$failed" = 0 ] || { say "FAILED (logs: $logs)"; exit 1; }
say ok
