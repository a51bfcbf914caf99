package host_test

import (
	"strings"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Repeated calls and confirmations: a repeat is answered from the record
// only when it asks for what the record holds.

const nodeTopologyKey = "topology.wasmcsi.dev/node"

func onNode(names ...string) *csi.TopologyRequirement {
	req := &csi.TopologyRequirement{}
	for _, n := range names {
		req.Requisite = append(req.Requisite, &csi.Topology{Segments: map[string]string{nodeTopologyKey: n}})
	}
	return req
}

// TestCreateVolumeRepeatTopology: a repeated CreateVolume whose requisite
// topology excludes where the recorded volume is accessible is
// ALREADY_EXISTS, never the volume the CO could not use there.
func TestCreateVolumeRepeatTopology(t *testing.T) {
	d, _ := specDaemon(t)
	base := func() *csi.CreateVolumeRequest {
		return &csi.CreateVolumeRequest{Name: "pinned", VolumeCapabilities: rwCaps(), CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, AccessibilityRequirements: onNode("test-node")}
	}
	vol := createVolume(t, d, base())
	if got := vol.GetAccessibleTopology(); len(got) != 1 || got[0].GetSegments()[nodeTopologyKey] != "test-node" {
		t.Fatalf("accessible topology %v", got)
	}
	cases := []struct {
		name string
		reqs *csi.TopologyRequirement
		want codes.Code
	}{
		{"same requisite", onNode("test-node"), codes.OK},
		{"requisite that includes the node", onNode("elsewhere", "test-node"), codes.OK},
		{"no requirements", nil, codes.OK},
		{"only a preference elsewhere", &csi.TopologyRequirement{Preferred: onNode("elsewhere").Requisite}, codes.OK},
		{"requisite on another key", &csi.TopologyRequirement{Requisite: []*csi.Topology{{Segments: map[string]string{"zone": "a"}}}}, codes.OK},
		{"requisite that excludes the node", onNode("elsewhere"), codes.AlreadyExists},
		{"requisite that excludes it among others", onNode("elsewhere", "further"), codes.AlreadyExists},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			req := base()
			req.AccessibilityRequirements = c.reqs
			resp, err := d.controller().CreateVolume(callCtx(t), req)
			if c.want == codes.OK {
				if err != nil || resp.GetVolume().GetVolumeId() != vol.GetVolumeId() {
					t.Fatalf("got %v, %v; want the existing volume", resp, err)
				}
				return
			}
			wantCode(t, err, c.want, "requisite")
		})
	}
}

// TestControllerPublishRepeatCapability: a repeated ControllerPublish to
// the same node with another access mode is ALREADY_EXISTS, like one with
// another readonly flag; the same access with other mount flags (a node
// concern) is the same publication.
func TestControllerPublishRepeatCapability(t *testing.T) {
	d, _ := specDaemon(t)
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "pubrepeat", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}, VolumeCapabilities: []*csi.VolumeCapability{
		mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY),
	}})
	info, err := d.node().NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(c *csi.VolumeCapability, readonly bool) error {
		_, err := d.controller().ControllerPublishVolume(callCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: info.GetNodeId(), VolumeCapability: c, Readonly: readonly})
		return err
	}
	if err := publish(rwCap, false); err != nil {
		t.Fatal(err)
	}
	withFlags := mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	withFlags.GetMount().MountFlags = []string{"noatime"}
	cases := []struct {
		name     string
		c        *csi.VolumeCapability
		readonly bool
		want     codes.Code
	}{
		{"identical", rwCap, false, codes.OK},
		{"other mount flags", withFlags, false, codes.OK},
		{"other readonly", rwCap, true, codes.AlreadyExists},
		{"other access mode", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY), false, codes.AlreadyExists},
		{"other single-writer mode", mountCap(csi.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER), false, codes.AlreadyExists},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := status.Code(publish(c.c, c.readonly)); got != c.want {
				t.Fatalf("got %s, want %s", got, c.want)
			}
		})
	}
	if _, err := d.controller().ControllerUnpublishVolume(callCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: vol.GetVolumeId(), NodeId: info.GetNodeId()}); err != nil {
		t.Fatal(err)
	}
}

// TestValidateVolumeCapabilitiesConfirmsOnlyWhatItChecked: the volume
// context, parameters and mutable parameters of a ValidateVolumeCapabilities
// are confirmed only when they are the volume's; anything else is not
// confirmed, with a message.
func TestValidateVolumeCapabilitiesConfirmsOnlyWhatItChecked(t *testing.T) {
	d, _ := specDaemon(t)
	vol := createVolume(t, d, &csi.CreateVolumeRequest{Name: "validate", CapacityRange: &csi.CapacityRange{RequiredBytes: 1 << 20}})
	other := map[string]string{}
	for k, v := range vol.GetVolumeContext() {
		other[k] = v + "x"
	}
	cases := []struct {
		name              string
		volCtx, params    map[string]string
		mutable           map[string]string
		confirmed         bool
		messageMentioning string
	}{
		{name: "capabilities only", confirmed: true},
		{name: "its volume context", volCtx: vol.GetVolumeContext(), confirmed: true},
		{name: "another volume context", volCtx: other, messageMentioning: "volume_context"},
		{name: "its backend", params: map[string]string{backendParam: "localdir"}, confirmed: true},
		{name: "another backend", params: map[string]string{backendParam: "fault"}, messageMentioning: "fault"},
		{name: "a parameter it was not created with", params: map[string]string{"tier": "gold"}, messageMentioning: "parameters"},
		{name: "a mutable parameter it does not have", mutable: map[string]string{"iops": "100"}, messageMentioning: "iops"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := d.controller().ValidateVolumeCapabilities(callCtx(t), &csi.ValidateVolumeCapabilitiesRequest{
				VolumeId: vol.GetVolumeId(), VolumeCapabilities: rwCaps(), VolumeContext: c.volCtx, Parameters: c.params, MutableParameters: c.mutable,
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := resp.GetConfirmed() != nil; got != c.confirmed {
				t.Fatalf("confirmed %v (%v), want %v", got, resp, c.confirmed)
			}
			if !c.confirmed {
				if resp.GetMessage() == "" || !strings.Contains(resp.GetMessage(), c.messageMentioning) {
					t.Errorf("message %q does not mention %q", resp.GetMessage(), c.messageMentioning)
				}
				return
			}
			conf := resp.GetConfirmed()
			if len(conf.GetVolumeCapabilities()) != 1 || len(conf.GetVolumeContext()) != len(c.volCtx) || len(conf.GetParameters()) != len(c.params) {
				t.Errorf("confirmed %v, want exactly what was asked", conf)
			}
		})
	}
}
