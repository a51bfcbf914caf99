# Sourced by .ci/k8s/test.sh in its pods mode: wasmcsi installed as users
# install it (images, helm install of deploy/helm/wasmcsi), and then the
# lifecycle an operator goes through with volumes in use: upgrade, daemon
# pod deleted and killed, module hot reload, uninstall.
#
# Uses test.sh's variables and functions: repo, work, logs, bin, csock,
# kubelet_dir, ns, node, GO, kubectl, waitfor, say, steps, mounts_under.

release=wasmcsi
chart=deploy/helm/wasmcsi
pods_values=$logs/values.yaml
plugin_sel=app.kubernetes.io/component=plugin,app.kubernetes.io/instance=$release

# container -> binary of the sidecar images (each image holds one binary,
# as upstream's do, at /<binary>).
# K8S_TIER_IMAGES
sidecar_binaries="
node-driver-registrar                   csi-node-driver-registrar
csi-provisioner                         csi-provisioner
csi-snapshotter                         csi-snapshotter
csi-resizer                             csi-resizer
csi-external-health-monitor-controller  csi-external-health-monitor-controller
livenessprobe                           livenessprobe
"

# build_image TAG: the wasmcsi image as `make image` builds it, its daemon
# reporting version TAG, imported into containerd as wasmcsi/wasmcsi:TAG.
build_image() {
	local s=$(date +%s)
	rm -f bin/wasmcsi # relinked with VERSION=TAG
	make -s image GO="$GO" VERSION="$1" IMAGE_TAG="$1" IMAGE_OUT="$work/images/wasmcsi-$1.tar" >>"$logs/image.log" 2>&1 ||
		{ say "FAILED: make image (log: $logs/image.log)"; tail -20 "$logs/image.log"; return 1; }
	ctr -a "$csock" -n k8s.io images import "$work/images/wasmcsi-$1.tar" >/dev/null || return 1
	say "image wasmcsi/wasmcsi:$1: $(du -m "$work/images/wasmcsi-$1.tar" | cut -f1) MiB archive, built in $(($(date +%s) - s)) s"
	rm -f "$work/images/wasmcsi-$1.tar"
}

# helm_ REST...: the chart's helm with the tier's kubeconfig.
helm_() { "$helm" --kubeconfig "$KUBECONFIG" "$@"; }

# plugin_pod: the name of the DaemonSet's current pod.
plugin_pod() { kubectl -n "$ns" get pods -l "$plugin_sel" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null; }

# daemon_restarts: the wasmcsi container's restart count in the current pod.
daemon_restarts() {
	kubectl -n "$ns" get pods -l "$plugin_sel" -o jsonpath='{.items[0].status.containerStatuses[?(@.name=="wasmcsi")].restartCount}'
}

plugin_ready() {
	[ "$(kubectl -n "$ns" get pods -l "$plugin_sel" -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{" "}{.metadata.deletionTimestamp}{"\n"}{end}')" = "True " ]
}

pods_install() {
	helm=$(GO=$GO bash .ci/helm.sh) || { say "FAILED: no helm (.ci/helm.sh)"; return 1; }
	mkdir -p "$work/images"
	(cd cmd/mkimage && "$GO" build -o "$work/mkimage" .) || { say "FAILED: go build cmd/mkimage"; return 1; }
	image_tag=tier-$(date +%s)
	build_image "$image_tag" || return 1
	local hm=true
	if [ ! -x "$bin/csi-external-health-monitor-controller" ]; then
		hm=false
		say "not running csi-external-health-monitor-controller: build.sh did not build it"
	fi
	# Only what a single-node test host needs differs from the defaults.
	cat >"$pods_values" <<EOF
# The Kubernetes tier's values for deploy/helm/wasmcsi (.ci/k8s/pods.sh).
image:
  # This run's image, imported into containerd; IfNotPresent never pulls it.
  tag: $image_tag
# kubelet runs with --root-dir in the run's folder, not /var/lib/kubelet.
kubeletDir: $kubelet_dir
nodeLocal:
  # Records, modules and pools in the run's folder, removed at teardown
  # (the default /var/lib/wasmcsi would outlive the run).
  basePath: $work/wasmcsi
sidecars:
  healthMonitor:
    # Built from its source tarball when present (build.sh).
    enabled: $hm
EOF
	# The sidecar images, named exactly as the chart renders them.
	"$helm" template "$release" "$chart" -n "$ns" -f "$pods_values" --kube-version "$K8S_VERSION" -s templates/daemonset.yaml >"$work/daemonset.rendered.yaml" || return 1
	kubectl create --dry-run=client -o json -f "$work/daemonset.rendered.yaml" |
		jq -r '.spec.template.spec.containers[] | select(.name != "wasmcsi") | "\(.name) \(.image)"' >"$work/sidecar-images" || return 1
	local c img b
	while read -r c img; do
		b=$(awk -v c="$c" '$1 == c { print $2 }' <<<"$sidecar_binaries")
		[ -n "$b" ] && [ -x "$bin/$b" ] || { say "FAILED: no binary for the sidecar $c ($img)"; return 1; }
		"$work/mkimage" binary -file "$bin/$b=/$b" -tag "$img" -out "$work/images/$b.tar" >>"$logs/image.log" 2>&1 &&
			ctr -a "$csock" -n k8s.io images import "$work/images/$b.tar" >/dev/null &&
			rm -f "$work/images/$b.tar" || { say "FAILED: image $img"; return 1; }
		echo "$img <- $bin/$b ($(awk -v b="$b" '$1 == b { print $2 }' "$(dirname "$bin")/sources" 2>/dev/null))" >>"$logs/sidecar-images.txt"
	done <"$work/sidecar-images"
	say "sidecar images: $(wc -l <"$work/sidecar-images") imported ($logs/sidecar-images.txt)"

	kubectl apply -f deploy/kubernetes/namespace.yaml >/dev/null || return 1
	local s=$(date +%s)
	say "helm install $release $chart (values: $pods_values)"
	if ! helm_ install "$release" "$chart" -n "$ns" -f "$pods_values" --wait --timeout 5m >"$logs/helm-install.log" 2>&1; then
		say "FAILED: helm install"
		tail -20 "$logs/helm-install.log"
		kubectl -n "$ns" get pods -o wide
		kubectl -n "$ns" describe pods | tail -40
		return 1
	fi
	# helm's --wait counts a DaemonSet ready when ready >= desired -
	# maxUnavailable, which is 0 on one node: wait for the pod itself.
	if ! waitfor 300 "the plugin pod ready" plugin_ready; then
		say "FAILED: the plugin pod is not ready"
		kubectl -n "$ns" get pods -o wide
		kubectl -n "$ns" describe pods | tail -40
		return 1
	fi
	say "helm install: pods ready in $(($(date +%s) - s)) s"
	kubectl -n "$ns" get pods -o wide | sed 's/^/  /'
}

# writers: a PVC and a pod writing to it without pause per backend; a
# write error ends the pod (restartPolicy Never), so Running afterwards
# means no write failed.
writers_up() {
	local cls vol
	for cls in localdir loopfile-xfs loopfile-block; do
		if [ "$cls" = loopfile-block ]; then
			vol='volumeDevices: [{name: v, devicePath: /dev/xvda}]'
			cmd='i=0; while true; do dd if=/dev/urandom of=/dev/xvda bs=4096 count=1 seek=$((i % 256)) conv=fsync 2>/dev/null || exit 1; i=$((i+1)); sleep 0.1; done'
		else
			vol='volumeMounts: [{name: v, mountPath: /data}]'
			cmd='while true; do date >>/data/log || exit 1; sync /data/log || exit 1; sleep 0.1; done'
		fi
		kubectl apply -f - >/dev/null <<EOF || return 1
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: writer-$cls, namespace: default}
spec:
  storageClassName: wasmcsi-$cls
  accessModes: [ReadWriteOnce]
  $([ "$cls" = loopfile-block ] && echo 'volumeMode: Block')
  resources: {requests: {storage: 64Mi}}
---
apiVersion: v1
kind: Pod
metadata: {name: writer-$cls, namespace: default}
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: w
      image: registry.k8s.io/e2e-test-images/busybox:1.37.0-1
      command: [sh, -c, '$cmd']
      $vol
  volumes: [{name: v, persistentVolumeClaim: {claimName: writer-$cls}}]
EOF
	done
	waitfor 120 "the writer pods" writers_running
}

writers_running() {
	local p
	for p in writer-localdir writer-loopfile-xfs writer-loopfile-block; do
		[ "$(kubectl -n default get pod "$p" -o jsonpath='{.status.phase}/{.status.containerStatuses[0].restartCount}')" = Running/0 ] || return 1
	done
}

# check_writers WHAT: every writer still running, having never failed a
# write; a volume still mounted in kubelet's folder.
check_writers() {
	local bad=""
	writers_running || bad=$(kubectl -n default get pods -o wide | grep writer-)
	if [ -n "$bad" ]; then
		steps+=("$(printf '%-28s FAILED: a writer stopped:\n%s' "$1" "$bad")")
		return 1
	fi
	[ -n "$(findmnt -rn -o TARGET | grep -F "$kubelet_dir/pods/" | grep -F /volumes/kubernetes.io~csi/)" ] ||
		{ steps+=("$(printf '%-28s FAILED: no CSI volume mounted in kubelet folder' "$1")"); return 1; }
}

step() { # NAME SECONDS RESULT
	steps+=("$(printf '%-28s %-6s %4d s  %s' "$1" "$3" "$2" "${4:-}")")
}

# logs_of_pod POD: the wasmcsi container's log of that pod.
logs_of_pod() { kubectl -n "$ns" logs "$1" -c wasmcsi 2>/dev/null; }

pods_lifecycle() {
	local s ok pod old new tag2 pid cid r0 before after mod b
	say "lifecycle: writers on localdir, loopfile-xfs and loopfile-block"
	writers_up || { step writers 0 FAILED; return 1; }

	# --- upgrade while writing ---
	s=$(date +%s)
	tag2=$image_tag-up
	ok=FAILED
	old=$(plugin_pod)
	if build_image "$tag2" && helm_ upgrade "$release" "$chart" -n "$ns" -f "$pods_values" --set image.tag="$tag2" \
		--wait --timeout 5m >>"$logs/helm-upgrade.log" 2>&1; then
		waitfor 120 "the upgraded plugin pod" plugin_ready
		new=$(plugin_pod)
		if [ "$new" != "$old" ] && logs_of_pod "$new" | grep -q "\"version\":\"$tag2\"" && check_writers upgrade; then
			ok=ok
		fi
	fi
	step "upgrade while writing" $(($(date +%s) - s)) $ok "pod $old -> ${new:-?}, version $tag2"
	[ $ok = ok ] || return 1

	# --- daemon pod deleted, then its container killed ---
	s=$(date +%s)
	ok=FAILED
	old=$(plugin_pod)
	kubectl -n "$ns" delete pod "$old" --wait=true >/dev/null 2>&1
	if waitfor 180 "a new plugin pod" plugin_ready && [ "$(plugin_pod)" != "$old" ] && check_writers "pod delete"; then
		r0=$(daemon_restarts)
		# kill -9 of the daemon process, as an OOM kill or a crash would:
		# the container's task in this run's containerd.
		cid=$(kubectl -n "$ns" get pods -l "$plugin_sel" -o jsonpath='{.items[0].status.containerStatuses[?(@.name=="wasmcsi")].containerID}')
		cid=${cid#containerd://}
		pid=$(ctr -a "$csock" -n k8s.io tasks ls 2>/dev/null | awk -v id="$cid" '$1 == id { print $2 }')
		if [ -n "$pid" ] && kill -KILL "$pid"; then
			waitfor 120 "the daemon container restarted" sh -c "[ \"\$(kubectl -n $ns get pods -l $plugin_sel -o jsonpath='{.items[0].status.containerStatuses[?(@.name==\"wasmcsi\")].restartCount}')\" -gt ${r0:-0} ]" &&
				waitfor 120 "the plugin pod ready" plugin_ready && check_writers "kill -9" && ok=ok
		fi
	fi
	step "daemon pod deleted, killed" $(($(date +%s) - s)) $ok "restarts ${r0:-?} -> $(daemon_restarts)"
	[ $ok = ok ] || return 1
	# The next pod's e2e still passes: one provisioning pass per backend.
	s=$(date +%s)
	ok=ok
	for b in localdir loopfile-xfs; do
		"$bin/ginkgo" --procs "$procs" --timeout 30m --no-color --focus 'External.Storage.*Dynamic PV \(default fs\).*volumes should store data' \
			--skip "$skip" "$bin/e2e.test" -- --kubeconfig="$kubeconfig" --storage.testdriver="$repo/.ci/k8s/drivers/$b.yaml" \
			--repo-root="$repo" --kubectl-path="$bin/kubectl" >"$logs/e2e-after-kill-$b.log" 2>&1 &&
			grep -q '^Ran [1-9]' "$logs/e2e-after-kill-$b.log" || ok=FAILED
	done
	step "e2e after the kill" $(($(date +%s) - s)) $ok "volumes should store data, localdir and loopfile-xfs (logs: e2e-after-kill-*.log)"
	[ $ok = ok ] || return 1

	# --- module hot reload in the pod ---
	# A new version of localdir (a custom section appended: another
	# digest, same code) dropped into the node's module folder, the
	# chart's host folder that the init container fills.
	s=$(date +%s)
	ok=FAILED
	pod=$(plugin_pod)
	r0=$(daemon_restarts)
	mod=$work/wasmcsi/modules/localdir.wasm
	before=$(sha256sum "$mod" | cut -d' ' -f1)
	# section id 0 (custom), size 9: name length 7, "wasmcsi", one byte.
	cp "$mod" "$work/localdir.new" && printf '\000\011\007wasmcsi\001' >>"$work/localdir.new" &&
		mv "$work/localdir.new" "$mod"
	after=$(sha256sum "$mod" | cut -d' ' -f1)
	if waitfor 60 "the reload of localdir" sh -c "kubectl -n $ns logs $pod -c wasmcsi | grep -q '\"msg\":\"module retired\".*\"module\":\"localdir\"'" &&
		[ "$(plugin_pod)" = "$pod" ] && [ "$(daemon_restarts)" = "$r0" ] && check_writers "hot reload"; then
		ok=ok
	fi
	step "module hot reload" $(($(date +%s) - s)) $ok "localdir ${before:0:12} -> ${after:0:12}, same pod, restarts $r0"
	[ $ok = ok ] || return 1

	# --- helm uninstall ---
	# The writers and their claims go first, as a user deletes what they
	# no longer want; then nothing of the driver may stay.
	s=$(date +%s)
	ok=FAILED
	kubectl -n default delete pod writer-localdir writer-loopfile-xfs writer-loopfile-block --wait=true >/dev/null 2>&1
	kubectl -n default delete pvc writer-localdir writer-loopfile-xfs writer-loopfile-block --wait=true >/dev/null 2>&1
	waitfor 120 "the writers' volumes deleted" sh -c "[ -z \"\$(kubectl get pv -o name)\" ]"
	local left=""
	if helm_ uninstall "$release" -n "$ns" --wait --timeout 3m >"$logs/helm-uninstall.log" 2>&1 &&
		waitfor 120 "the plugin pods gone" sh -c "[ -z \"\$(kubectl -n $ns get pods -o name)\" ]"; then
		no_registration() { ! kubectl get csinode "$node" -o jsonpath='{.spec.drivers[*].name}' | grep -qw wasmcsi.dev; }
		waitfor 60 "kubelet to drop the registration" no_registration || left="$left registration;"
		[ -z "$(kubectl -n "$ns" get pods -o name)" ] || left="$left pods;"
		[ ! -e "$kubelet_dir/plugins/wasmcsi.dev/csi.sock" ] || left="$left socket $kubelet_dir/plugins/wasmcsi.dev/csi.sock;"
		[ -z "$(ls "$kubelet_dir/plugins_registry/" 2>/dev/null | grep wasmcsi)" ] || left="$left registration socket;"
		[ -z "$(findmnt -rn -o TARGET | grep -F "$kubelet_dir/" | grep -e wasmcsi -e kubernetes.io~csi)" ] || left="$left mounts;"
		[ -z "$(kubectl get csidriver,storageclass,volumesnapshotclass -o name | grep wasmcsi)" ] || left="$left objects;"
		[ -n "$left" ] || ok=ok
	fi
	step "helm uninstall" $(($(date +%s) - s)) $ok "${left:-no pod, socket, registration or mount left}"
	[ $ok = ok ] || return 1
	raw_manifests "$tag2"
}

# raw_manifests TAG: deploy/kubernetes as `kubectl apply -k` applies it,
# with only its host paths moved into the run's folder and the image tag
# of this run; the pods come up, one short e2e pass, then delete.
raw_manifests() {
	local s=$(date +%s) ok=FAILED raw=$work/raw.yaml
	kubectl kustomize deploy/kubernetes |
		sed -e "s|/var/lib/kubelet|$kubelet_dir|g" -e "s|/var/lib/wasmcsi|$work/wasmcsi|g" \
			-e "s|image: wasmcsi/wasmcsi:dev\$|image: wasmcsi/wasmcsi:$1|" >"$raw" || return 1
	plugin_sel=app.kubernetes.io/name=wasmcsi,app.kubernetes.io/component=plugin
	if kubectl apply -f "$raw" >"$logs/raw-apply.log" 2>&1 &&
		waitfor 180 "the raw manifests' pod" plugin_ready && waitfor 60 "registration" csinode_ready &&
		"$bin/ginkgo" --procs 1 --timeout 20m --no-color --focus 'External.Storage.*Dynamic PV \(default fs\).*volumes should store data' \
			--skip "$skip" "$bin/e2e.test" -- --kubeconfig="$kubeconfig" --storage.testdriver="$repo/.ci/k8s/drivers/localdir.yaml" \
			--repo-root="$repo" --kubectl-path="$bin/kubectl" >"$logs/e2e-raw-manifests.log" 2>&1 &&
		grep -q '^Ran [1-9]' "$logs/e2e-raw-manifests.log" &&
		kubectl delete -f "$raw" --wait=true --timeout=120s >>"$logs/raw-apply.log" 2>&1; then
		ok=ok
	fi
	step "kubectl apply -k (raw)" $(($(date +%s) - s)) $ok "deploy/kubernetes, volumes should store data on localdir (log: e2e-raw-manifests.log)"
	[ $ok = ok ]
}
