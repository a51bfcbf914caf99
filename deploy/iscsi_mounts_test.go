package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The iscsi node daemon creates and updates node records as it stages a
// volume (`iscsiadm -m node -o new`, then `-o update`, hostcalls/iscsi),
// which bookworm's open-iscsi writes under /etc/iscsi/nodes. This runs
// those two commands with /etc/iscsi (and /var/lib/iscsi where the host
// has it) mounted as the split layout's node container mounts them,
// read-only where its manifest says so, in a mount namespace of its own
// over a copy of the host's /etc/iscsi: the host's records are not
// touched, and no iscsid is needed to write a record. The chart renders
// the same mounts (TestHelmChartRendersTheManifests).
func TestIscsiNodeRecordsUnderManifestMounts(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace with bind mounts")
	}
	for _, tool := range []string{"iscsiadm", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (open-iscsi, util-linux): %v", tool, err)
		}
	}
	if _, err := os.Stat("/etc/iscsi/iscsid.conf"); err != nil {
		t.Skip("needs open-iscsi's /etc/iscsi/iscsid.conf: ", err)
	}
	spec, ok := workloads(t, readObjects(t, "kubernetes-split"))["wasmcsi-iscsi-node"]
	if !ok {
		t.Fatal("kubernetes-split: no workload wasmcsi-iscsi-node")
	}
	d := spec.container(t, "wasmcsi")
	tmp := t.TempDir()
	var script []string
	script = append(script, "set -e", "mount --make-rprivate /")
	for _, dir := range []string{"/etc/iscsi", "/var/lib/iscsi"} {
		m, ok := d.mountAt(dir)
		if !ok {
			t.Fatalf("the node daemon does not mount %s", dir)
		}
		if _, err := os.Stat(dir); err != nil {
			continue // not on this host (bookworm keeps records in /etc/iscsi)
		}
		copyDir := filepath.Join(tmp, strings.ReplaceAll(strings.Trim(dir, "/"), "/", "-"))
		if out, err := exec.Command("cp", "-a", dir, copyDir).CombinedOutput(); err != nil {
			t.Fatalf("copy %s: %v\n%s", dir, err, out)
		}
		script = append(script, "mount --bind "+copyDir+" "+dir)
		if m.ReadOnly {
			script = append(script, "mount -o remount,bind,ro "+dir)
		}
	}
	const iqn, portal = "iqn.2026-01.dev.wasmcsi:mounts-test", "127.0.0.1:3260"
	base := "iscsiadm -m node -T " + iqn + " -p " + portal
	script = append(script,
		base+" -o new",
		base+" -o update -n node.startup -v manual",
		"test -d /etc/iscsi/nodes/"+iqn+" || test -d /var/lib/iscsi/nodes/"+iqn,
		base+" -o delete")
	out, err := exec.Command("unshare", "-m", "sh", "-c", strings.Join(script, "\n")).CombinedOutput()
	if err != nil {
		t.Fatalf("node records with the node daemon's mounts: %v\n%s\n(script:\n%s)", err, out, strings.Join(script, "\n"))
	}
}
