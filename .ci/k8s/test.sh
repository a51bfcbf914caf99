#!/usr/bin/env bash
# The Kubernetes tier: a real single-node Kubernetes (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, containerd, kubelet, CNI bridge)
# on 127.0.0.1 runs wasmcsi as users install it, and the upstream
# external-storage e2e suite (e2e.test -storage.testdriver) tests it once
# per backend with the driver definitions in .ci/k8s/drivers/.
#
# Two modes (WASMCSI_K8S_MODE):
#   pods            `make image` builds the wasmcsi image and cmd/mkimage
#                   one image per sidecar binary, tagged as the chart names
#                   them; they are imported into containerd and
#                   `helm install` of deploy/helm/wasmcsi runs the daemon and
#                   every sidecar as pods under kubelet (values for this tier
#                   in $logs/values.yaml, each justified there). After the
#                   e2e passes: upgrade while writers write, daemon pod
#                   deleted and its container killed, a module hot-reloaded
#                   in the pod, helm uninstall (WASMCSI_K8S_LIFECYCLE=0 skips
#                   these).
#   host (default)  this tree's bin/wasmcsi with the configuration of
#                   deploy/kubernetes/configmap.yaml and the sidecars with
#                   the flags of deploy/kubernetes/daemonset.yaml as host
#                   processes with an admin kubeconfig. Kept because it needs
#                   no image (no mmdebstrap, no Debian archive) and runs a
#                   daemon a debugger or a fresh `make build` can attach to
#                   between runs; it is not how users install. The default
#                   until the pods mode has passed on the project's machines
#                   (deploy/README.md).
#
# Binaries come from build.sh (cached per Kubernetes version). Images are
# made here without a registry (pause, busybox, agnhost and a busybox
# stand-in for nginx, tagged with the names e2e.test asks for) and imported
# into containerd. Everything lives in one temporary folder, torn down on
# every exit, also on failure: pods' volumes released while the driver still
# runs, every process stopped, mounts below the folder unmounted, loop
# devices on its files detached, network namespaces, the CNI bridge, CNI
# state, kubelet's cgroups and the iptables chains the run added removed.
#
# Prints per backend the e2e result (passed, failed, skipped, seconds) and
# exits non-zero when a spec failed or the teardown left something. Skips
# with the reason without root, without the Go module proxy, or without the
# sidecar sources (WASMCSI_THIRDPARTY, see build.sh).
#
#   bash .ci/k8s/test.sh                    (or: make test-k8s)
#   WASMCSI_K8S_BACKENDS=localdir           one driver definition of drivers/
#   WASMCSI_K8S_FOCUS='provisioning'        one e2e pass with this focus (regexp),
#                                           instead of the full run per backend
#   WASMCSI_K8S_PROCS=3                     ginkgo parallel processes
#   WASMCSI_K8S_MODE=host                   the host-process mode (above)
set -uo pipefail
cd "$(dirname "$0")/../.."
repo=$PWD
GO=${GO:-go}
export K8S_VERSION=${K8S_VERSION:-1.34.2}
export WASMCSI_THIRDPARTY=${WASMCSI_THIRDPARTY:-$repo/../shared/thirdparty}
backends=${WASMCSI_K8S_BACKENDS:-"localdir loopfile-xfs loopfile-block"}
focus=${WASMCSI_K8S_FOCUS:-}
procs=${WASMCSI_K8S_PROCS:-3}
mode=${WASMCSI_K8S_MODE:-host}
lifecycle=${WASMCSI_K8S_LIFECYCLE:-1}
case $mode in pods | host) ;; *) echo "k8s-tier: WASMCSI_K8S_MODE=$mode: want pods or host" >&2; exit 2 ;; esac
# kubelet refuses a loopback node IP, so the API server reaches it by its
# host name, which must resolve to 127.0.0.1 where kubelet listens.
node=localhost
ns=wasmcsi
api_port=26443
etcd_port=22379
t0=$(date +%s)

say() { echo "k8s-tier: $*"; }

if [ "$(id -u)" != 0 ]; then
	say "skipped: kubelet, containerd and the plugin mount and attach (needs root)"
	exit 0
fi
if ! command -v "$GO" >/dev/null; then
	say "skipped: no Go toolchain ($GO) to build Kubernetes and wasmcsi"
	exit 0
fi
if ! "$GO" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" >/dev/null 2>&1; then
	say "skipped: the Go module proxy does not serve k8s.io/kubernetes@v$K8S_VERSION"
	exit 0
fi

logs=$repo/bin/k8s-tier
rm -rf "$logs"
mkdir -p "$logs"

say "make build"
make -s build GO="$GO" || { say "FAILED: make build"; exit 1; }
# One Go build at a time: the Kubernetes build takes both cores for long.
say "Kubernetes v$K8S_VERSION: build or cache (log: $logs/build.log)"
bin=$(GO=$GO bash .ci/k8s/build.sh 2>"$logs/build.log")
rc=$?
if [ "$rc" = 3 ]; then
	say "skipped: $(tail -1 "$logs/build.log")"
	exit 0
fi
[ "$rc" = 0 ] || { say "FAILED: Kubernetes build:"; tail -20 "$logs/build.log"; exit 1; }
for tool in jq losetup findmnt openssl containerd ctr runc etcd ip iptables-save; do
	command -v "$tool" >/dev/null || { say "skipped: $tool is not installed"; exit 0; }
done
t_built=$(date +%s)
say "built in $((t_built - t0)) s: $bin"

work=$(mktemp -d "${TMPDIR:-/tmp}/wasmcsi-k8s.XXXXXX")
pki=$work/pki
kubelet_dir=$work/kubelet
sock=$kubelet_dir/plugins/wasmcsi.dev/csi.sock
csock=$work/containerd/containerd.sock
kubeconfig=$work/kubeconfig
bridge=wcsik8s0
export KUBECONFIG=$kubeconfig
mkdir -p "$pki" "$kubelet_dir/plugins/wasmcsi.dev" "$kubelet_dir/plugins_registry" "$work/containerd" \
	"$work/cni/net.d" "$work/wasmcsi" "$work/images"
kubectl() { "$bin/kubectl" "$@"; }

# What the machine had before, so that teardown removes only what the run added.
netns_before=$(ls /run/netns 2>/dev/null)
[ -e /run/netns ] && run_netns_existed=1 || run_netns_existed=0
shims_before=$(ls /run/containerd/s 2>/dev/null)
[ -e /run/containerd ] && run_containerd_existed=1 || run_containerd_existed=0
[ -e /var/lib/cni ] && cni_existed=1 || cni_existed=0
iptables-save >"$work/iptables.before" 2>/dev/null
ip6tables-save >"$work/ip6tables.before" 2>/dev/null

declare -a pids=() names=()
# start NAME CMD...: runs CMD in the background, its output in $logs/NAME.log.
start() {
	local name=$1
	shift
	"$@" >"$logs/$name.log" 2>&1 &
	pids+=("$!")
	names+=("$name")
}

. .ci/work.sh

# procs_of_work: processes whose command line names $work (containerd's
# shims, every component) and every container process (cgroup kubepods).
procs_of_work() {
	local p
	for p in /proc/[0-9]*; do
		p=${p#/proc/}
		[ "$p" = $$ ] && continue
		if tr '\0' ' ' 2>/dev/null <"/proc/$p/cmdline" | grep -qF "$work" ||
			grep -q ':/kubepods' "/proc/$p/cgroup" 2>/dev/null; then
			echo "$p"
		fi
	done
}
new_netns() { comm -13 <(echo "$netns_before") <(ls /run/netns 2>/dev/null); }
kubepods_cgroups() { find /sys/fs/cgroup/*/kubepods -depth -type d 2>/dev/null; }
# new_chains FILE SAVE: "table chain" of user chains SAVE shows that FILE
# did not (built-in chains, with a policy, appear when a table is first used).
new_chains() {
	comm -13 <(awk '/^\*/ { t = substr($1, 2) } /^:/ && $2 == "-" { print t, substr($1, 2) }' "$1" | sort) \
		<("$2" 2>/dev/null | awk '/^\*/ { t = substr($1, 2) } /^:/ && $2 == "-" { print t, substr($1, 2) }' | sort)
}
# drop_chains FILE SAVE CMD: removes the chains the run added and the rules
# that jump to them.
drop_chains() {
	local t c r
	new_chains "$1" "$2" | while read -r t c; do
		"$3" -t "$t" -F "$c" 2>/dev/null
		"$2" -t "$t" 2>/dev/null | grep -E -- "-j $c( |$)" | sed 's/^-A /-D /' | while read -r r; do
			eval "\"$3\" -t \"$t\" $r" 2>/dev/null
		done
	done
	new_chains "$1" "$2" | while read -r t c; do "$3" -t "$t" -X "$c" 2>/dev/null; done
}

teardown() {
	local rc=$? m l p i left=0 d
	trap - EXIT INT TERM
	say "teardown"
	# Volumes first, while the driver and kubelet still run: what a failed
	# spec left (pods, claims, snapshots) is deleted so that kubelet
	# unpublishes and the provisioner deletes, as a cluster would.
	if [ -n "${api_up:-}" ]; then
		for d in $(kubectl get ns -o name 2>/dev/null | sed 's|namespace/||' | grep -v -E '^(default|kube-.*|'"$ns"')$'); do
			kubectl delete ns "$d" --wait=false >/dev/null 2>&1
		done
		kubectl delete pods,pvc --all -n default --wait=false >/dev/null 2>&1
		# Bounded: a namespace may hang on a snapshot no sidecar handles;
		# what stays is removed with the folder below.
		for i in $(seq 90); do
			[ -z "$(kubectl get pv -o name 2>/dev/null)" ] &&
				[ "$(kubectl get ns -o name 2>/dev/null | wc -l)" -le 5 ] && break
			sleep 1
		done
		kubectl get pv,volumesnapshotcontents 2>/dev/null | sed 's/^/  left in the API: /'
	fi
	# Then every process, most dependent first.
	for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
		kill -TERM "${pids[i]}" 2>/dev/null
		for _ in $(seq 50); do kill -0 "${pids[i]}" 2>/dev/null || break; sleep 0.1; done
		kill -KILL "${pids[i]}" 2>/dev/null
		wait "${pids[i]}" 2>/dev/null
	done
	for _ in 1 2 3; do
		for p in $(procs_of_work); do kill -KILL "$p" 2>/dev/null; done
		sleep 0.5
	done
	for m in $(new_netns); do
		umount "/run/netns/$m" 2>/dev/null
		rm -f "/run/netns/$m"
	done
	[ "$run_netns_existed" = 1 ] || rmdir /run/netns 2>/dev/null
	for m in $(mounts_under); do
		umount "$m" 2>/dev/null || umount -l "$m" || echo "k8s-tier: teardown: cannot unmount $m" >&2
	done
	for l in $(loops_on_work); do
		losetup -d "$l" || echo "k8s-tier: teardown: cannot detach $l" >&2
	done
	ip link del "$bridge" 2>/dev/null
	for d in $(kubepods_cgroups); do rmdir "$d" 2>/dev/null; done
	# containerd's shims keep their sockets in /run/containerd/s whatever
	# its state folder.
	if [ "$run_containerd_existed" = 0 ]; then
		rm -rf /run/containerd
	else
		for m in $(comm -13 <(echo "$shims_before") <(ls /run/containerd/s 2>/dev/null)); do rm -f "/run/containerd/s/$m"; done
	fi
	if [ "$cni_existed" = 0 ]; then
		rm -rf /var/lib/cni
	else
		rm -rf /var/lib/cni/networks/wasmcsi-k8s /var/lib/cni/results/wasmcsi-k8s-*
	fi
	drop_chains "$work/iptables.before" iptables-save iptables
	drop_chains "$work/ip6tables.before" ip6tables-save ip6tables
	# What is left, if anything, is a failure of the tier.
	local what
	what=$(
		mounts_under | sed 's/^/mount /'
		loops_on_work | sed 's/^/loop device /'
		procs_of_work | sed 's/^/process /'
		new_netns | sed 's/^/netns /'
		ip link show "$bridge" 2>/dev/null | head -1 | sed 's/^/link /'
		kubepods_cgroups | sed 's/^/cgroup /'
		new_chains "$work/iptables.before" iptables-save | sed 's/^/iptables chain /'
		new_chains "$work/ip6tables.before" ip6tables-save | sed 's/^/ip6tables chain /'
	)
	if [ -n "$what" ]; then
		echo "k8s-tier: teardown left:" >&2
		echo "$what" >&2
		left=1
	else
		rm -rf --one-file-system "$work"
		say "teardown: no process, mount, loop device, netns, link, cgroup or iptables chain left"
	fi
	[ "$left" = 0 ] || rc=1
	say "total $(($(date +%s) - t0)) s"
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM
# The chart mounts kubelet's folder with Bidirectional propagation (the
# daemon's stage and publish mounts must reach the host) and the pools with
# HostToContainer: containerd refuses both ("is not a shared mount") when
# the folder's mount is private, as / is on hosts without systemd. The run's
# folder becomes its own shared mount; teardown unmounts it last (it is the
# shallowest entry of mounts_under).
if [ "$mode" = pods ]; then
	mount --bind "$work" "$work" && mount --make-rshared "$work" || { say "FAILED: shared mount of $work"; exit 1; }
fi

# waitfor SECONDS WHAT CMD...: polls CMD every second until it succeeds.
waitfor() {
	local n=$1 what=$2 i
	shift 2
	for ((i = 0; i < n; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 1
	done
	echo "k8s-tier: timed out after $n s waiting for $what" >&2
	return 1
}

# --- credentials: one CA, the apiserver's serving cert, the service
# account key, one admin token for everything (a test cluster) ---
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=wasmcsi-k8s-ca \
	-keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null &&
	openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver \
		-keyout "$pki/apiserver.key" -out "$pki/apiserver.csr" 2>/dev/null &&
	openssl x509 -req -in "$pki/apiserver.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 2 \
		-extfile <(echo 'subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes.default.svc') \
		-out "$pki/apiserver.crt" 2>/dev/null &&
	openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null &&
	openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null || { say "FAILED: certificates"; exit 1; }
token=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')
echo "$token,admin,admin,system:masters" >"$pki/tokens.csv"
cat >"$kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: tier
    cluster: {server: "https://127.0.0.1:$api_port", certificate-authority: "$pki/ca.crt"}
users:
  - name: admin
    user: {token: "$token"}
contexts:
  - name: tier
    context: {cluster: tier, user: admin}
current-context: tier
EOF

# --- control plane ---
# Pods reach the API server at the kubernetes Service (10.0.0.1:443, what
# kubelet puts in KUBERNETES_SERVICE_HOST). No kube-proxy runs: a DNAT rule
# of the tier's own chain sends it to the API server on the bridge's
# address, so in pods mode the API server listens beyond 127.0.0.1 (token
# authentication, for the run only).
api_bind=127.0.0.1
if [ "$mode" = pods ]; then
	api_bind=0.0.0.0
	iptables -t nat -N WASMCSI-K8S-SVC &&
		iptables -t nat -A WASMCSI-K8S-SVC -d 10.0.0.1/32 -p tcp --dport 443 -j DNAT --to-destination "10.88.77.1:$api_port" &&
		iptables -t nat -I PREROUTING -j WASMCSI-K8S-SVC || { say "FAILED: the Service rule for the API server"; exit 1; }
fi
say "starting etcd, kube-apiserver (logs: $logs)"
start etcd etcd --name "$node" --data-dir "$work/etcd" \
	--listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
	--listen-peer-urls "http://127.0.0.1:$((etcd_port + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((etcd_port + 1))" \
	--initial-cluster "$node=http://127.0.0.1:$((etcd_port + 1))"
start kube-apiserver "$bin/kube-apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" \
	--bind-address="$api_bind" --advertise-address=127.0.0.1 --secure-port="$api_port" --cert-dir="$pki" \
	--tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" --client-ca-file="$pki/ca.crt" \
	--token-auth-file="$pki/tokens.csv" --authorization-mode=RBAC --allow-privileged=true \
	--service-account-issuer=https://kubernetes.default.svc --service-account-key-file="$pki/sa.pub" \
	--service-account-signing-key-file="$pki/sa.key" --service-cluster-ip-range=10.0.0.0/24 \
	--kubelet-preferred-address-types=Hostname
api_ready() { [ "$(kubectl get --raw /readyz 2>/dev/null)" = ok ]; }
waitfor 120 "kube-apiserver" api_ready || { tail -20 "$logs/kube-apiserver.log"; exit 1; }
api_up=1
say "kube-apiserver ready after $(($(date +%s) - t_built)) s"
start kube-controller-manager "$bin/kube-controller-manager" --kubeconfig="$kubeconfig" \
	--bind-address=127.0.0.1 --secure-port=0 --leader-elect=false --root-ca-file="$pki/ca.crt" \
	--service-account-private-key-file="$pki/sa.key" --use-service-account-credentials=false
start kube-scheduler "$bin/kube-scheduler" --kubeconfig="$kubeconfig" \
	--bind-address=127.0.0.1 --secure-port=0 --leader-elect=false

# --- containerd, CNI, images ---
cat >"$work/containerd/config.toml" <<EOF
version = 2
root = "$work/containerd/root"
state = "$work/containerd/state"
[grpc]
  address = "$csock"
[ttrpc]
  address = "$csock.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$work/containerd/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10.1"
  # runc cannot write oom_score_adj where CAP_SYS_RESOURCE is dropped; with
  # this, containerd never asks for a lower score than its own.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$work/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$work/cni/net.d"
EOF
cat >"$work/cni/net.d/10-wasmcsi-k8s.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "wasmcsi-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$bridge",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$work/cni/ipam",
        "ranges": [[{"subnet": "10.88.77.0/24"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
start containerd containerd --config "$work/containerd/config.toml"
waitfor 60 "containerd" ctr -a "$csock" version || { tail -20 "$logs/containerd.log"; exit 1; }

# image REF ROOTFS CONFIG: imports ROOTFS as a one-layer image tagged REF.
image() {
	local ref=$1 rootfs=$2 cfg=$3 d
	d=$work/images/$(echo "$ref" | tr '/:' '__')
	mkdir -p "$d"
	tar -C "$rootfs" --numeric-owner --owner=0 --group=0 -cf "$d/layer.tar" . || return 1
	printf '{"architecture":"amd64","os":"linux","config":%s,"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
		"$cfg" "$(sha256sum "$d/layer.tar" | cut -d' ' -f1)" >"$d/config.json"
	printf '[{"Config":"config.json","RepoTags":["%s"],"Layers":["layer.tar"]}]' "$ref" >"$d/manifest.json"
	tar -C "$d" -cf "$d.tar" manifest.json config.json layer.tar &&
		ctr -a "$csock" -n k8s.io images import "$d.tar" >/dev/null && rm -rf "$d" "$d.tar"
}
busybox_root() { # DIR: a root filesystem with Debian's static busybox
	mkdir -p "$1/bin" "$1/sbin" "$1/usr/bin" "$1/usr/sbin" "$1/etc" "$1/tmp" "$1/proc" "$1/sys" "$1/dev" "$1/root"
	cp /bin/busybox "$1/bin/busybox"
	chroot "$1" /bin/busybox --install -s
	chmod 1777 "$1/tmp"
	printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' >"$1/etc/passwd"
	printf 'root:x:0:\nnogroup:x:65534:\n' >"$1/etc/group"
}
e2e_reg=registry.k8s.io/e2e-test-images
say "importing images"
{
	mkdir -p "$work/rootfs/pause" && cp "$bin/pause" "$work/rootfs/pause/pause" &&
		image registry.k8s.io/pause:3.10.1 "$work/rootfs/pause" '{"Entrypoint":["/pause"]}' &&
		busybox_root "$work/rootfs/busybox" &&
		image "$e2e_reg/busybox:1.37.0-1" "$work/rootfs/busybox" '{"Cmd":["sh"]}' &&
		cp "$bin/agnhost" "$work/rootfs/busybox/agnhost" &&
		image "$e2e_reg/agnhost:2.56" "$work/rootfs/busybox" '{"Entrypoint":["/agnhost"],"Cmd":["pause"]}' &&
		rm "$work/rootfs/busybox/agnhost" && mkdir -p "$work/rootfs/busybox/usr/share/nginx/html" &&
		echo ok >"$work/rootfs/busybox/usr/share/nginx/html/index.html" &&
		image "$e2e_reg/nginx:1.14-4" "$work/rootfs/busybox" \
			'{"Cmd":["httpd","-f","-p","80","-h","/usr/share/nginx/html"],"ExposedPorts":{"80/tcp":{}}}'
} || { say "FAILED: images"; exit 1; }
rm -rf "$work/rootfs"

# --- kubelet ---
cat >"$work/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: 21250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 21248
containerRuntimeEndpoint: unix://$csock
# cgroup v1 host without systemd; Kubernetes 1.35+ refuses v1 unless told.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
podLogsDir: $work/pod-logs
volumePluginDir: $work/flexvolume
resolvConf: /etc/resolv.conf
# The imported images cannot be pulled again: never collect them.
imageGCHighThresholdPercent: 100
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
EOF
start kubelet "$bin/kubelet" --config="$work/kubelet.yaml" --kubeconfig="$kubeconfig" \
	--root-dir="$kubelet_dir" --cert-dir="$work/kubelet-pki" --hostname-override="$node" --v=1
node_ready() { kubectl get node "$node" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True; }
waitfor 120 "node $node Ready" node_ready || { tail -20 "$logs/kubelet.log"; exit 1; }

if [ "$mode" = host ]; then
# --- wasmcsi, as the DaemonSet runs it ---
# config.yaml of the ConfigMap, with only its /var/lib/wasmcsi paths moved
# into the work folder; the modules installed as the init container does.
awk '/^  config.yaml: \|/ { on = 1; next } on && /^    / { print substr($0, 5); next } on && /^[^ ]/ { on = 0 } on && /^$/ { print }' \
	deploy/kubernetes/configmap.yaml | sed "s|/var/lib/wasmcsi|$work/wasmcsi|g" >"$work/wasmcsi/config.yaml"
grep -q "state_dir: $work/wasmcsi/state" "$work/wasmcsi/config.yaml" || { say "FAILED: no config.yaml in deploy/kubernetes/configmap.yaml"; exit 1; }
mkdir -p "$work/wasmcsi/modules"
cp bin/modules/*.wasm "$work/wasmcsi/modules/"
rm -f "$work/wasmcsi/modules/"*.tinygo.wasm
start wasmcsi env CSI_ENDPOINT="unix://$sock" WASMCSI_NODE_ID="$node" "$repo/bin/wasmcsi" serve --config "$work/wasmcsi/config.yaml"
waitfor 60 "the wasmcsi socket" test -S "$sock" || { tail -20 "$logs/wasmcsi.log"; exit 1; }

# --- the sidecars, with daemonset.yaml's own arguments ---
# Each container's args are read from the DaemonSet; a host process needs
# these changes only (TestK8sTierSidecars in deploy/ checks that each names
# a flag the container has, and that every sidecar container runs here):
#   --csi-address, --kubelet-registration-path   the socket in the work folder
#   --http-endpoint=:N                           127.0.0.1:N
#   --capacity-ownerref-level                    -1: no pod owns the objects
#                                                (any level >= 0 needs POD_NAME)
# and two additions: --kubeconfig for those that talk to the API server
# (admin; no in-cluster service account) and the registrar's
# --plugin-registration-path (kubelet's plugins_registry).
# $(VAR) references expand from the environment, as kubelet expands them.
# K8S_TIER_SIDECARS
# container               binary                      talks to the API server
sidecar_table="
node-driver-registrar     csi-node-driver-registrar   no
csi-provisioner           csi-provisioner             yes
csi-snapshotter           csi-snapshotter             yes
csi-resizer               csi-resizer                 yes
csi-external-health-monitor-controller csi-external-health-monitor-controller yes
livenessprobe             livenessprobe               no
"
# Binary "-" would mean: not run, with the reason here.
# K8S_TIER_OVERRIDES
# container               flag                          value
override_table="
*                         --csi-address                 $sock
node-driver-registrar     --kubelet-registration-path   $sock
csi-provisioner           --capacity-ownerref-level     -1
"
# Environment of every sidecar: the downward-API variables of daemonset.yaml.
# K8S_TIER_ENV
sidecar_env="NODE_NAME=$node KUBE_NODE_NAME=$node NAMESPACE=$ns"

kubectl apply -f deploy/kubernetes/namespace.yaml >/dev/null || exit 1
kubectl create --dry-run=client -o json -f deploy/kubernetes/daemonset.yaml >"$work/daemonset.json" || exit 1
sidecar_args() { # CONTAINER API: its args from daemonset.yaml, changed for a host process
	local c=$1 api=$2 a f v oc of ov
	jq -r --arg c "$c" '.spec.template.spec.containers[] | select(.name == $c) | .args[]' "$work/daemonset.json" |
		while IFS= read -r a; do
			f=${a%%=*}
			v=${a#*=}
			[ "$f" = "$a" ] && v=""
			while read -r oc of ov; do
				[ -n "$oc" ] || continue
				if { [ "$oc" = "*" ] || [ "$oc" = "$c" ]; } && [ "$of" = "$f" ]; then v=$ov; fi
			done <<<"$override_table"
			case "$f=$v" in --http-endpoint=:*) v=127.0.0.1$v ;; esac
			v=${v//\$(NAMESPACE)/$ns}
			v=${v//\$(NODE_NAME)/$node}
			if [ "$f" = "$a" ]; then echo "$f"; else echo "$f=$v"; fi
		done
	[ "$api" != yes ] || echo "--kubeconfig=$kubeconfig"
	[ "$c" != node-driver-registrar ] || echo "--plugin-registration-path=$kubelet_dir/plugins_registry"
}
while read -r c b api; do
	[ -n "$c" ] || continue
	[ "$b" != - ] || { say "not running $c: no source to build it from"; continue; }
	mapfile -t args < <(sidecar_args "$c" "$api")
	[ "${#args[@]}" -gt 1 ] || { say "FAILED: no container $c in deploy/kubernetes/daemonset.yaml"; exit 1; }
	echo "$b ${args[*]}" >>"$logs/sidecars.txt"
	# shellcheck disable=SC2086
	start "$c" env $sidecar_env "$bin/$b" "${args[@]}"
done <<<"$sidecar_table"

fi

# Snapshot CRDs and the cluster's snapshot-controller, which the per-node
# csi-snapshotter needs with distributed snapshotting on. Both are the
# cluster's, not the driver's: the snapshot-controller runs as a host
# process in both modes.
kubectl apply -f "$(dirname "$bin")/crd" >/dev/null || exit 1
start snapshot-controller "$bin/snapshot-controller" --kubeconfig="$kubeconfig" --enable-distributed-snapshotting=true --http-endpoint=127.0.0.1:9814
waitfor 60 "the snapshot CRDs" kubectl get volumesnapshotclasses || exit 1
if [ "$mode" = host ]; then
	kubectl apply -f deploy/kubernetes/csidriver.yaml -f deploy/kubernetes/storageclasses.yaml >/dev/null || exit 1
	kubectl apply -f deploy/kubernetes/snapshotclass.yaml >/dev/null || exit 1
else
	. .ci/k8s/pods.sh
	pods_install || exit 1
fi
csinode_ready() { kubectl get csinode "$node" -o jsonpath='{.spec.drivers[*].name}' | grep -qw wasmcsi.dev; }
sidecar_log() { # CONTAINER: the last lines of its log, host process or pod
	if [ "$mode" = host ]; then tail -20 "$logs/$1.log"; else kubectl -n "$ns" logs -l app.kubernetes.io/component=plugin -c "$1" --tail=20; fi
}
waitfor 60 "kubelet to register wasmcsi.dev" csinode_ready || { sidecar_log node-driver-registrar; exit 1; }
capacity() { [ -n "$(kubectl get csistoragecapacities -n "$ns" -o name)" ]; }
waitfor 90 "CSIStorageCapacity objects" capacity || { sidecar_log csi-provisioner; exit 1; }
t_up=$(date +%s)
say "cluster and driver up in $((t_up - t_built)) s"

# --- the upstream external-storage suite, per backend ---
# Skipped, always, for these reasons:
#   [Disruptive] [Serial]  restart kubelet or need the whole cluster
#   [Slow]                 minutes each; the tier stays within CI's time
#   volumeMode should not mount / map unused volumes in a pod
#                          its helper pod runs nsenter --mount=/rootfs/proc/1/ns/mnt;
#                          on a host whose PID 1 mount namespace only PID 1
#                          may open, it cannot pass for any driver
#   Pre-provisioned Snapshot
#                          a per-node csi-snapshotter (--node-deployment, as
#                          daemonset.yaml runs it) watches only contents
#                          labelled snapshot.storage.kubernetes.io/managed-by=<node>;
#                          the snapshot-controller labels the contents it
#                          creates, the suite's hand-made contents carry none
skip='\[Disruptive\]|\[Serial\]|\[Slow\]|should not mount / map unused volumes in a pod|Pre-provisioned Snapshot'
# Per driver definition: the extra skips, with the reason, in drivers/<name>.skip
# (one "regexp<TAB>reason" a line), and an optional focus in drivers/<name>.focus.
declare -a summary=()
failed=0
for b in $backends; do
	drv=.ci/k8s/drivers/$b.yaml
	[ -f "$drv" ] || { say "FAILED: no driver definition $drv"; failed=1; continue; }
	bskip=$skip
	if [ -f ".ci/k8s/drivers/$b.skip" ]; then
		while IFS=$'\t' read -r re why; do
			[ -n "$re" ] && [ "${re:0:1}" != "#" ] || continue
			say "[$b] skipping /$re/: $why"
			bskip="$bskip|$re"
		done <".ci/k8s/drivers/$b.skip"
	fi
	if [ -n "$focus" ]; then
		passes=("$focus")
	else
		bfocus='.*'
		[ -f ".ci/k8s/drivers/$b.focus" ] && bfocus=$(grep -v '^#' ".ci/k8s/drivers/$b.focus")
		# Snapshot and VolumeAttributesClass specs are all [Feature:...]:
		# their own pass.
		# A definition's focus may match before or after the tag (a
		# pattern's name comes first, "(block volmode)").
		feat='\[Feature:(VolumeSnapshotDataSource|VolumeAttributesClass)\]'
		passes=("External.Storage.*($bfocus)" "External.Storage.*(($bfocus).*$feat|$feat.*($bfocus))")
	fi
	for i in "${!passes[@]}"; do
		f=${passes[i]}
		pskip=$bskip
		[ "$i" = 0 ] && [ -z "$focus" ] && pskip="$pskip|\[Feature:"
		s=$(date +%s)
		say "[$b] e2e pass $((i + 1)): focus /$f/ (log: $logs/e2e-$b-$((i + 1)).log)"
		"$bin/ginkgo" --procs "$procs" --timeout 90m --no-color --focus "$f" --skip "$pskip" \
			"$bin/e2e.test" -- --kubeconfig="$kubeconfig" --storage.testdriver="$repo/$drv" --repo-root="$repo" --kubectl-path="$bin/kubectl" \
			--report-dir="$logs/e2e-$b-$((i + 1))" >"$logs/e2e-$b-$((i + 1)).log" 2>&1
		rc=$?
		# Selected: specs the focus and skip chose; of those, the suite
		# itself skips the ones whose capability the definition lacks.
		line=$(grep -E '[0-9]+ Passed \| [0-9]+ Failed' "$logs/e2e-$b-$((i + 1)).log" | tail -1)
		p=$(echo "$line" | sed -n 's/.*[^0-9]\([0-9]*\) Passed.*/\1/p')
		fl=$(echo "$line" | sed -n 's/.*| \([0-9]*\) Failed.*/\1/p')
		sel=$(sed -n 's/^Will run \([0-9]*\) of.*/\1/p' "$logs/e2e-$b-$((i + 1)).log" | head -1)
		ran=$(sed -n 's/^Ran \([0-9]*\) of.*/\1/p' "$logs/e2e-$b-$((i + 1)).log" | tail -1)
		sk="?"
		[ -n "$sel" ] && [ -n "$ran" ] && sk=$((sel - ran))
		summary+=("$(printf '%-15s pass %d  selected %4s  passed %4s  failed %4s  skipped %4s  %5d s  rc %d' \
			"$b" $((i + 1)) "${sel:-?}" "${p:-?}" "${fl:-?}" "$sk" $(($(date +%s) - s)) "$rc")")
		if [ "$rc" != 0 ]; then
			failed=1
			grep -E '^\s*\[FAIL\]|^  \[FAILED\]' "$logs/e2e-$b-$((i + 1)).log" | sort -u | head -20
		fi
	done
done

t_e2e=$(date +%s)
declare -a steps=()
if [ "$mode" = pods ] && [ "$lifecycle" = 1 ]; then
	pods_lifecycle || failed=1
fi

echo
say "Kubernetes v$K8S_VERSION, mode $mode (build $((t_built - t0)) s, up $((t_up - t_built)) s, e2e $((t_e2e - t_up)) s, lifecycle $(($(date +%s) - t_e2e)) s)"
printf '%s\n' "${summary[@]}"
[ "${#steps[@]}" = 0 ] || printf '%s\n' "${steps[@]}"
[ "$failed" = 0 ] || { say "FAILED (logs: $logs)"; exit 1; }
say ok
