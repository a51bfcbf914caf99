#!/usr/bin/env bash
# Builds everything the Kubernetes tier runs, once per Kubernetes version: the
# control plane, kubelet, kubectl, the upstream e2e suite (e2e.test, ginkgo,
# agnhost), a static pause, and the CSI sidecars. Results are cached under
# $K8S_CACHE/k8s-v$K8S_VERSION/bin; a second run finds them and only prints the
# folder. Debian packages the tier needs (containerd, runc, etcd, CNI plugins,
# busybox) are installed with apt-get when missing.
#
# Kubernetes comes from the Go module proxy: its go.mod replaces every staging
# module (k8s.io/api, ...) with ./staging/..., which a module download does not
# carry, so each replace is pointed at the published module of the same
# release (v0.X.Y for vX.Y). external-snapshotter comes from the proxy the same
# way (its client/v8 replace pointed at the published client/v8). The proxy
# refuses the other sidecars (provisioner, resizer, registrar, livenessprobe):
# their sources, with vendor/, are read from $WASMCSI_THIRDPARTY/<repo>-*.tar.gz
# (default ../shared/thirdparty beside the repository), as is the
# health monitor's. Without them this exits
# with status 3 and says which is missing.
#
# Prints the bin folder on stdout; progress and per-component build times go to
# stderr and to bin/../build-times.
set -euo pipefail

GO=${GO:-go}
K8S_VERSION=${K8S_VERSION:-1.34.2}
SNAPSHOTTER_VERSION=${SNAPSHOTTER_VERSION:-8.7.0}
K8S_CACHE=${K8S_CACHE:-/var/cache/wasmcsi}
repo=$(cd "$(dirname "$0")/../.." && pwd)
WASMCSI_THIRDPARTY=${WASMCSI_THIRDPARTY:-$repo/../shared/thirdparty}
top=$K8S_CACHE/k8s-v$K8S_VERSION
bin=$top/bin
staging=v0.${K8S_VERSION#*.}

k8s_bins="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl e2e.test agnhost ginkgo pause"
sidecar_bins="csi-provisioner csi-resizer csi-node-driver-registrar livenessprobe csi-snapshotter snapshot-controller csi-external-health-monitor-controller"
apt_pkgs="containerd runc etcd-server containernetworking-plugins busybox-static jq iptables util-linux e2fsprogs xfsprogs"

have_all() {
	local b
	for b in $k8s_bins $sidecar_bins; do [ -x "$bin/$b" ] || return 1; done
	[ -f "$top/crd/groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml" ]
}

install_debs() {
	local missing="" p
	for p in $apt_pkgs; do
		dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
	done
	[ -z "$missing" ] && return 0
	echo "k8s build: apt-get install$missing" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >&2
}

# timed NAME CMD...: runs CMD unless bin/NAME exists, and records how long it took.
timed() {
	local name=$1 start
	shift
	[ -x "$bin/$name" ] && return 0
	echo "k8s build: $name" >&2
	start=$(date +%s)
	"$@" >&2
	[ -x "$bin/$name" ] || { echo "k8s build: $name: no binary" >&2; exit 1; }
	echo "$name $(( $(date +%s) - start ))s" | tee -a "$top/build-times" >&2
}

# The version the Kubernetes binaries report: upstream's build stamps it
# with -X, a module build would report v0.0.0-master+$Format:%H$ and the
# chart's kubeVersion (helm install) would refuse the cluster.
kver=""
for vp in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
	kver="$kver -X $vp.gitVersion=v$K8S_VERSION -X $vp.gitMajor=${K8S_VERSION%%.*} -X $vp.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2) -X $vp.gitTreeState=clean"
done
k8s_stamped="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl e2e.test"

# stamped: the cached Kubernetes binaries report v$K8S_VERSION; those of
# an earlier build.sh that did not stamp them are removed (rebuilt below,
# which only links again when the build cache is warm).
stamped() {
	[ ! -x "$bin/kube-apiserver" ] || "$bin/kube-apiserver" --version | grep -qx "Kubernetes v$K8S_VERSION" && return 0
	echo "k8s build: the cached Kubernetes binaries report no version: building them again" >&2
	for b in $k8s_stamped; do rm -f "$bin/$b"; done
	return 1
}

gobuild() { # OUT PKG [go build flags...]
	local out=$1 pkg=$2
	shift 2
	"$GO" build -p 2 -trimpath -ldflags "-s -w ${ldx:-}" "$@" -o "$bin/$out.tmp" "$pkg"
	mv "$bin/$out.tmp" "$bin/$out"
}

gotestc() { # OUT PKG
	"$GO" test -p 2 -c -vet=off -trimpath -ldflags "-s -w ${ldx:-}" -o "$bin/$1.tmp" "$2"
	mv "$bin/$1.tmp" "$bin/$1"
}

modsrc() { # MODULE@VERSION DEST: a writable copy of a module from the proxy
	local json dir
	json=$("$GO" mod download -json "$1" || true)
	dir=$(echo "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
	[ -n "$dir" ] || { echo "k8s build: no module folder for $1: $json" >&2; exit 1; }
	mkdir -p "$2"
	cp -r "$dir/." "$2/"
	chmod -R u+w "$2"
}

tarball() { # REPO: the newest source tarball of REPO in WASMCSI_THIRDPARTY
	ls "$WASMCSI_THIRDPARTY/$1"-*.tar.gz 2>/dev/null | sort -V | tail -n 1
}

if stamped && have_all; then
	install_debs
	echo "$bin"
	exit 0
fi
mkdir -p "$bin"
exec 9>"$top/.lock"
flock 9

# The sidecars the proxy refuses: fail before an hour of building if absent.
missing=""
for r in external-provisioner external-resizer node-driver-registrar livenessprobe external-health-monitor; do
	[ -n "$(tarball $r)" ] || missing="$missing $r"
done
if [ -n "$missing" ]; then
	for b in csi-provisioner csi-resizer csi-node-driver-registrar livenessprobe csi-external-health-monitor-controller; do
		[ -x "$bin/$b" ] || { echo "k8s build: no source tarball for$missing in $WASMCSI_THIRDPARTY (set WASMCSI_THIRDPARTY to the folder holding <repo>-<version>.tar.gz with vendor/)" >&2; exit 3; }
	done
fi

install_debs
export GOFLAGS="-mod=mod -buildvcs=false" GOWORK=off CGO_ENABLED=0
work=$(mktemp -d "${TMPDIR:-/tmp}/wasmcsi-k8s-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# external-snapshotter from the proxy, with the CRDs (snapshots and group
# snapshots) of its client module.
if [ ! -x "$bin/csi-snapshotter" ] || [ ! -x "$bin/snapshot-controller" ]; then
	snap=$work/external-snapshotter
	modsrc "github.com/kubernetes-csi/external-snapshotter/v8@v$SNAPSHOTTER_VERSION" "$snap"
	cd "$snap"
	"$GO" mod edit -replace "github.com/kubernetes-csi/external-snapshotter/client/v8=github.com/kubernetes-csi/external-snapshotter/client/v8@v$SNAPSHOTTER_VERSION"
	rm -rf vendor
	timed csi-snapshotter gobuild csi-snapshotter ./cmd/csi-snapshotter
	timed snapshot-controller gobuild snapshot-controller ./cmd/snapshot-controller
	cd /
fi
if [ ! -f "$top/crd/groupsnapshot.storage.k8s.io_volumegroupsnapshots.yaml" ]; then
	client=$work/snapshot-client
	modsrc "github.com/kubernetes-csi/external-snapshotter/client/v8@v$SNAPSHOTTER_VERSION" "$client"
	rm -rf "$top/crd.tmp"
	mkdir -p "$top/crd.tmp"
	cp "$client"/config/crd/*snapshot.storage.k8s.io_*.yaml "$top/crd.tmp/"
	rm -rf "$top/crd"
	mv "$top/crd.tmp" "$top/crd"
	cd /
fi

# The sidecars the proxy refuses, from their vendored source tarballs.
sidecar() { # REPO BINARY
	[ -x "$bin/$2" ] && return 0
	local t
	t=$(tarball "$1")
	mkdir -p "$work/$1"
	tar -xzf "$t" -C "$work/$1" --strip-components=1
	cd "$work/$1"
	GOFLAGS="-mod=vendor -buildvcs=false" timed "$2" gobuild "$2" "./cmd/$2"
	echo "$2 $(basename "$t" .tar.gz)" >>"$top/sources"
	cd /
}
sidecar node-driver-registrar csi-node-driver-registrar
sidecar livenessprobe livenessprobe
sidecar external-resizer csi-resizer
sidecar external-provisioner csi-provisioner
sidecar external-health-monitor csi-external-health-monitor-controller

need_k8s=""
for b in $k8s_bins; do [ -x "$bin/$b" ] || need_k8s=1; done
if [ -n "$need_k8s" ]; then
	k8s=$work/kubernetes
	modsrc "k8s.io/kubernetes@v$K8S_VERSION" "$k8s"
	cd "$k8s"
	rm -f go.work go.work.sum
	for m in $(sed -n 's|^[[:space:]]*\(k8s.io/[^ ]*\) => ./staging/.*|\1|p' go.mod); do
		"$GO" mod edit -replace "$m=$m@$staging"
	done
	timed pause gcc -static -Os -Wall -DVERSION="v$K8S_VERSION" -o "$bin/pause" build/pause/linux/pause.c
	ldx=$kver timed kube-apiserver gobuild kube-apiserver ./cmd/kube-apiserver
	ldx=$kver timed kube-controller-manager gobuild kube-controller-manager ./cmd/kube-controller-manager
	ldx=$kver timed kube-scheduler gobuild kube-scheduler ./cmd/kube-scheduler
	ldx=$kver timed kubelet gobuild kubelet ./cmd/kubelet
	ldx=$kver timed kubectl gobuild kubectl ./cmd/kubectl
	timed ginkgo gobuild ginkgo github.com/onsi/ginkgo/v2/ginkgo
	# CGO_ENABLED=0: the image has no libc, a dynamic agnhost cannot start.
	timed agnhost gobuild agnhost ./test/images/agnhost
	# Only the storage suites are compiled in (the tier runs nothing else;
	# the other suites and their dependencies double the build): the other
	# test-source imports of e2e_test.go are dropped.
	sed -i -E '/^\s*_ "k8s\.io\/kubernetes\/test\/e2e\/(apimachinery|apps|architecture|auth|autoscaling|cloud|dra|instrumentation|kubectl|lifecycle|lifecycle\/bootstrap|network|node|scheduling|storage\/csimock|windows)"$/d' test/e2e/e2e_test.go
	ldx=$kver timed e2e.test gotestc e2e.test ./test/e2e
	cd /
fi

have_all || { echo "k8s build: incomplete" >&2; exit 1; }
echo "$bin"
