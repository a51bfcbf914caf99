// Package deploy holds the deployment files of wasmcsi: Kubernetes
// manifests (kubernetes/ for one daemon per node, kubernetes-split/ for a
// controller Deployment plus a node DaemonSet), a Nomad job and volume
// (nomad/), the image (Dockerfile) and the deploy guide (README.md).
//
// It has no code. Its tests load the configuration the manifests carry with
// the daemon's own loader and check that paths, ports, images, grants, RBAC
// and the sidecars' modes agree across the files, so that a change to the
// daemon's configuration or to one manifest cannot silently break another.
// It must never be imported.
package deploy
