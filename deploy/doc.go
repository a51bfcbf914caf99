// Package deploy holds the deployment files of wasmcsi: Kubernetes
// manifests (kubernetes/ for one daemon per node, kubernetes-split/ for the
// iscsi driver's controller Deployment plus node DaemonSet), a Helm chart
// rendering either (helm/wasmcsi), Nomad jobs and a volume (nomad/), the
// image (Dockerfile) and the deploy guide (README.md).
//
// It has no code. Its tests load the configuration the manifests carry with
// the daemon's own loader and check that paths, ports, images, grants, RBAC
// and the sidecars' modes agree across the files, and that the chart renders
// the manifests object by object (with helm from WASMCSI_HELM or PATH,
// skipped without), so that a change to the
// daemon's configuration or to one manifest cannot silently break another.
// It must never be imported.
package deploy
