package host_test

import (
	"maps"
	"slices"
	"testing"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
)

// TestControllerPublishNodeIDs: ControllerPublishVolume knows a node only
// by an ID NodeGetInfo issued; any other is NOT_FOUND and records nothing.
// With the issued ID it succeeds even though localdir has no
// controller_publish (the host records the publication as a no-op), and
// ControllerUnpublish takes it back.
func TestControllerPublishNodeIDs(t *testing.T) {
	d := startDaemon(t, localdirOptions(t))
	v := createVolume(t, d, &csi.CreateVolumeRequest{Name: "published"})
	info, err := d.node().NodeGetInfo(callCtx(t), &csi.NodeGetInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	issued := info.GetNodeId()
	caps, err := d.controller().ControllerGetCapabilities(callCtx(t), &csi.ControllerGetCapabilitiesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if hasControllerCap(caps, csi.ControllerServiceCapability_RPC_PUBLISH_UNPUBLISH_VOLUME) {
		t.Error("PUBLISH_UNPUBLISH_VOLUME advertised although no backend has controller_publish")
	}

	publish := func(volume, node string) (*csi.ControllerPublishVolumeResponse, error) {
		return d.controller().ControllerPublishVolume(callCtx(t), &csi.ControllerPublishVolumeRequest{VolumeId: volume, NodeId: node, VolumeCapability: rwCap})
	}
	publishedTo := func() []string {
		got, err := d.controller().ControllerGetVolume(callCtx(t), &csi.ControllerGetVolumeRequest{VolumeId: v.GetVolumeId()})
		if err != nil {
			t.Fatal(err)
		}
		return got.GetStatus().GetPublishedNodeIds()
	}

	for _, id := range []string{
		"test-node",         // the node's name, not the ID NodeGetInfo issued
		"some-fake-node-id", // what csi-sanity sends
		";",                 // no name
		";x=1",              // no name, with a context
		"test-node;%zz",     // a context that does not decode
	} {
		t.Run(id, func(t *testing.T) {
			_, err := publish(v.GetVolumeId(), id)
			wantCode(t, err, codes.NotFound, "node")
			if nodes := publishedTo(); len(nodes) != 0 {
				t.Errorf("published to %v after a refused publish", nodes)
			}
		})
	}

	_, err = publish("localdir:v-no-such-volume", issued)
	wantCode(t, err, codes.NotFound, "volume")

	for i := range 2 {
		resp, err := publish(v.GetVolumeId(), issued)
		if err != nil {
			t.Fatalf("ControllerPublish #%d with the issued ID %q: %v", i+1, issued, err)
		}
		// A backend without controller_publish adds nothing; the host
		// names the node it recorded the publication for.
		if want := map[string]string{"wasmcsi.dev/published-node": "test-node"}; !maps.Equal(resp.GetPublishContext(), want) {
			t.Errorf("publish context %v, want %v", resp.GetPublishContext(), want)
		}
	}
	if nodes := publishedTo(); !slices.Equal(nodes, []string{issued}) {
		t.Errorf("published to %v, want [%s]", nodes, issued)
	}
	_, err = d.controller().DeleteVolume(callCtx(t), &csi.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})
	wantCode(t, err, codes.FailedPrecondition, "published")
	if _, err := d.controller().ControllerUnpublishVolume(callCtx(t), &csi.ControllerUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: issued}); err != nil {
		t.Fatal(err)
	}
	if nodes := publishedTo(); len(nodes) != 0 {
		t.Errorf("published to %v after unpublish", nodes)
	}
}
