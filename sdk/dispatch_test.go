package sdk

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/wasmcsi/wasmcsi/abi"
)

// full implements Backend and every optional interface. Each method
// records its name and request and answers resp (nil answers a typed nil)
// and err.
type full struct {
	info   abi.BackendInfo
	called string
	got    abi.Message
	resp   abi.Message
	err    error
}

// as returns m as *T, or a typed nil when m is nil or of another type.
func as[T any](m abi.Message) *T {
	t, _ := any(m).(*T)
	return t
}

func (f *full) hit(method string, req abi.Message) { f.called, f.got = method, req }

func (f *full) Info() abi.BackendInfo { f.hit("Info", nil); return f.info }
func (f *full) Configure(r *abi.ConfigureRequest) error {
	f.hit("Configure", r)
	return f.err
}
func (f *full) CreateVolume(r *abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	f.hit("CreateVolume", r)
	return as[abi.CreateVolumeResponse](f.resp), f.err
}
func (f *full) DeleteVolume(r *abi.DeleteVolumeRequest) error {
	f.hit("DeleteVolume", r)
	return f.err
}
func (f *full) ExpandVolume(r *abi.ExpandVolumeRequest) (*abi.ExpandVolumeResponse, error) {
	f.hit("ExpandVolume", r)
	return as[abi.ExpandVolumeResponse](f.resp), f.err
}
func (f *full) ModifyVolume(r *abi.ModifyVolumeRequest) (*abi.ModifyVolumeResponse, error) {
	f.hit("ModifyVolume", r)
	return as[abi.ModifyVolumeResponse](f.resp), f.err
}
func (f *full) ListOwned(r *abi.ListOwnedRequest) (*abi.ListOwnedResponse, error) {
	f.hit("ListOwned", r)
	return as[abi.ListOwnedResponse](f.resp), f.err
}
func (f *full) CreateSnapshot(r *abi.CreateSnapshotRequest) (*abi.CreateSnapshotResponse, error) {
	f.hit("CreateSnapshot", r)
	return as[abi.CreateSnapshotResponse](f.resp), f.err
}
func (f *full) DeleteSnapshot(r *abi.DeleteSnapshotRequest) error {
	f.hit("DeleteSnapshot", r)
	return f.err
}
func (f *full) GetCapacity(r *abi.GetCapacityRequest) (*abi.GetCapacityResponse, error) {
	f.hit("GetCapacity", r)
	return as[abi.GetCapacityResponse](f.resp), f.err
}
func (f *full) ControllerPublish(r *abi.ControllerPublishRequest) (*abi.ControllerPublishResponse, error) {
	f.hit("ControllerPublish", r)
	return as[abi.ControllerPublishResponse](f.resp), f.err
}
func (f *full) ControllerUnpublish(r *abi.ControllerUnpublishRequest) error {
	f.hit("ControllerUnpublish", r)
	return f.err
}
func (f *full) VolumeHealth(r *abi.VolumeHealthRequest) (*abi.HealthResponse, error) {
	f.hit("VolumeHealth", r)
	return as[abi.HealthResponse](f.resp), f.err
}
func (f *full) StorageHealth() (*abi.HealthResponse, error) {
	f.hit("StorageHealth", nil)
	return as[abi.HealthResponse](f.resp), f.err
}
func (f *full) NodeInfo() (*abi.NodeInfoResponse, error) {
	f.hit("NodeInfo", nil)
	return as[abi.NodeInfoResponse](f.resp), f.err
}
func (f *full) NodeStage(r *abi.NodeStageRequest) (*abi.NodeStageResponse, error) {
	f.hit("NodeStage", r)
	return as[abi.NodeStageResponse](f.resp), f.err
}
func (f *full) NodeUnstage(r *abi.NodeUnstageRequest) error {
	f.hit("NodeUnstage", r)
	return f.err
}
func (f *full) NodeExpand(r *abi.NodeExpandRequest) (*abi.NodeExpandResponse, error) {
	f.hit("NodeExpand", r)
	return as[abi.NodeExpandResponse](f.resp), f.err
}
func (f *full) SnapshotData(r *abi.SnapshotDataRequest) (*abi.SnapshotDataResponse, error) {
	f.hit("SnapshotData", r)
	return as[abi.SnapshotDataResponse](f.resp), f.err
}

// bare implements only Backend.
type bare struct{ info abi.BackendInfo }

func (b *bare) Info() abi.BackendInfo { return b.info }
func (b *bare) CreateVolume(*abi.CreateVolumeRequest) (*abi.CreateVolumeResponse, error) {
	return &abi.CreateVolumeResponse{LocalID: "v"}, nil
}
func (b *bare) DeleteVolume(*abi.DeleteVolumeRequest) error { return nil }

type opCase struct {
	op     abi.Op
	method string
	// req is what the host sends; nil for operations that take Empty.
	req abi.Message
	// resp is what the backend answers; nil for operations answering Empty.
	resp abi.Message
}

// opCases has one row per operation except backend_info, with requests and
// responses that set fields of every kind, so a mix-up of message types
// cannot decode to an equal value.
func opCases() []opCase {
	vol := abi.VolumeRef{LocalID: "v-1", Context: map[string]string{"path": "/pool/v-1"}, CapacityBytes: 1 << 30}
	snap := abi.SnapshotRef{LocalID: "s-1", Context: map[string]string{"k": "v"}, SizeBytes: 4096, Source: vol}
	capab := abi.Capability{FsType: "xfs", MountFlags: []string{"noatime"}, AccessMode: abi.AccessSingleNodeWriter}
	topo := abi.Topology{Segments: map[string]string{"zone": "a"}}
	health := &abi.HealthResponse{Entries: []abi.HealthEntry{{Status: abi.HealthDegraded, Reason: "Slow", Message: "disk is slow"}}}
	return []opCase{
		{abi.OpConfigure, "Configure", &abi.ConfigureRequest{Config: map[string]string{"quota": "off"}, Roots: []string{"/pool"}, NodeID: "n1", Role: "all"}, nil},
		{abi.OpCreateVolume, "CreateVolume",
			&abi.CreateVolumeRequest{Name: "pvc-1", RequiredBytes: 1 << 30, LimitBytes: 2 << 30, Parameters: map[string]string{"a": "b"},
				Capabilities: []abi.Capability{capab}, Source: &abi.VolumeSource{Snapshot: &snap}, Requisite: []abi.Topology{topo}},
			&abi.CreateVolumeResponse{LocalID: "v-1", CapacityBytes: 1 << 30, Context: map[string]string{"path": "/pool/v-1"}, Topology: []abi.Topology{topo}}},
		{abi.OpDeleteVolume, "DeleteVolume", &abi.DeleteVolumeRequest{Volume: vol}, nil},
		{abi.OpExpandVolume, "ExpandVolume", &abi.ExpandVolumeRequest{Volume: vol, RequiredBytes: 2 << 30, Capability: &capab},
			&abi.ExpandVolumeResponse{CapacityBytes: 2 << 30, NodeExpansionRequired: true}},
		{abi.OpModifyVolume, "ModifyVolume", &abi.ModifyVolumeRequest{Volume: vol, MutableParameters: map[string]string{"prealloc": "true"}, Secrets: map[string]string{"s": "t"}},
			&abi.ModifyVolumeResponse{Context: map[string]string{"prealloc": "true"}}},
		{abi.OpListOwned, "ListOwned", &abi.ListOwnedRequest{},
			&abi.ListOwnedResponse{Items: []abi.OwnedItem{{LocalID: "v-1", Name: "pvc-1", Context: map[string]string{"vg": "vg0"}, SizeBytes: 1 << 30}, {LocalID: "s-1", Snapshot: true}}}},
		{abi.OpCreateSnapshot, "CreateSnapshot", &abi.CreateSnapshotRequest{Name: "snap-1", Source: vol, Parameters: map[string]string{"x": "y"}},
			&abi.CreateSnapshotResponse{LocalID: "s-1", SizeBytes: 4096, ReadyToUse: true}},
		{abi.OpDeleteSnapshot, "DeleteSnapshot", &abi.DeleteSnapshotRequest{Snapshot: snap}, nil},
		{abi.OpGetCapacity, "GetCapacity", &abi.GetCapacityRequest{Parameters: map[string]string{"a": "b"}, Topology: &topo, Capability: &capab},
			&abi.GetCapacityResponse{AvailableBytes: 10 << 30, MaximumVolumeSize: 5 << 30, MinimumVolumeSize: 4096}},
		{abi.OpControllerPublish, "ControllerPublish", &abi.ControllerPublishRequest{Volume: vol, NodeID: "n1", ReadOnly: true, Capability: capab, NodeContext: map[string]string{"iqn": "iqn.x"}},
			&abi.ControllerPublishResponse{PublishContext: map[string]string{"lun": "1"}}},
		{abi.OpControllerUnpublish, "ControllerUnpublish", &abi.ControllerUnpublishRequest{Volume: vol, NodeID: "n1"}, nil},
		{abi.OpVolumeHealth, "VolumeHealth", &abi.VolumeHealthRequest{Volume: vol, OnNode: true, StagingPath: "/staging", Device: "/dev/loop0"}, health},
		{abi.OpStorageHealth, "StorageHealth", nil, health},
		{abi.OpNodeInfo, "NodeInfo", nil, &abi.NodeInfoResponse{Topology: &topo, Context: map[string]string{"iqn": "iqn.x"}}},
		{abi.OpNodeStage, "NodeStage", &abi.NodeStageRequest{Volume: vol, PublishContext: map[string]string{"lun": "1"}, StagingPath: "/staging", Capability: capab, Secrets: map[string]string{"s": "t"}},
			&abi.NodeStageResponse{Device: "/dev/loop0", MountFlags: []string{"nouuid"}, Context: map[string]string{"loop": "/dev/loop0"}}},
		{abi.OpNodeUnstage, "NodeUnstage", &abi.NodeUnstageRequest{Volume: vol, Device: "/dev/loop0", StageContext: map[string]string{"loop": "/dev/loop0"}}, nil},
		{abi.OpNodeExpand, "NodeExpand", &abi.NodeExpandRequest{Volume: vol, Device: "/dev/loop0", RequiredBytes: 2 << 30},
			&abi.NodeExpandResponse{CapacityBytes: 2 << 30}},
		{abi.OpSnapshotData, "SnapshotData", &abi.SnapshotDataRequest{Snapshot: snap},
			&abi.SnapshotDataResponse{Path: "/pool/s-1.img", SizeBytes: 1 << 30, BlockSize: 65536}},
	}
}

// newOf returns a fresh zero message of m's type.
func newOf(m abi.Message) abi.Message {
	return reflect.New(reflect.TypeOf(m).Elem()).Interface().(abi.Message)
}

func encode(m abi.Message) []byte {
	if m == nil {
		return (&abi.Empty{}).AppendWire(nil)
	}
	return m.AppendWire(nil)
}

func TestOpCasesCoverEveryOperation(t *testing.T) {
	seen := map[abi.Op]bool{abi.OpInfo: true} // backend_info has its own tests
	for _, tc := range opCases() {
		seen[tc.op] = true
	}
	for _, op := range abi.AllOps {
		if !seen[op] {
			t.Errorf("no dispatch case for %s", op)
		}
	}
}

func TestDispatchCallsTheOperation(t *testing.T) {
	for _, tc := range opCases() {
		t.Run(string(tc.op), func(t *testing.T) {
			f := &full{resp: tc.resp}
			out, code := Dispatch(f, tc.op, encode(tc.req))
			if code != abi.OK {
				t.Fatalf("code %v: %s", code, out)
			}
			if f.called != tc.method {
				t.Errorf("called %q, want %q", f.called, tc.method)
			}
			if tc.req != nil && !reflect.DeepEqual(f.got, tc.req) {
				t.Errorf("backend got %+v\nwant %+v", f.got, tc.req)
			}
			if tc.resp == nil {
				if len(out) != 0 {
					t.Errorf("answer %x, want the empty message", out)
				}
				return
			}
			got := newOf(tc.resp)
			if err := got.UnmarshalWire(out); err != nil {
				t.Fatalf("answer does not decode as %T: %v", tc.resp, err)
			}
			if !reflect.DeepEqual(got, tc.resp) {
				t.Errorf("answer %+v\nwant %+v", got, tc.resp)
			}
		})
	}
}

func TestDispatchNilResponseIsZeroMessage(t *testing.T) {
	for _, tc := range opCases() {
		if tc.resp == nil {
			continue
		}
		f := &full{} // answers a typed nil and no error
		out, code := Dispatch(f, tc.op, encode(tc.req))
		if code != abi.OK || len(out) != 0 {
			t.Errorf("%s: (nil, nil) answered %v %x, want OK and the empty message", tc.op, code, out)
		}
	}
}

func TestDispatchUnimplemented(t *testing.T) {
	b := &bare{}
	for _, tc := range opCases() {
		want := abi.Unimplemented
		if tc.op == abi.OpCreateVolume || tc.op == abi.OpDeleteVolume {
			want = abi.OK
		}
		if Implements(b, tc.op) != (want == abi.OK) {
			t.Errorf("Implements(bare, %s) = %v", tc.op, Implements(b, tc.op))
		}
		out, code := Dispatch(b, tc.op, encode(tc.req))
		if code != want {
			t.Errorf("%s: code %v (%s), want %v", tc.op, code, out, want)
		}
		if want == abi.Unimplemented && !strings.Contains(string(out), string(tc.op)) {
			t.Errorf("%s: message %q does not name the operation", tc.op, out)
		}
	}
	for _, b := range []Backend{&bare{}, &full{}} {
		if out, code := Dispatch(b, "frobnicate", nil); code != abi.Unimplemented {
			t.Errorf("%T: unknown operation answered %v %q, want UNIMPLEMENTED", b, code, out)
		}
	}
}

func TestDispatchBadRequest(t *testing.T) {
	// Field 1, length-delimited, claims 5 bytes and has 1: truncated for
	// every message type, including Empty.
	garbage := []byte{0x0a, 0x05, 'x'}
	for _, tc := range opCases() {
		f := &full{resp: tc.resp}
		out, code := Dispatch(f, tc.op, garbage)
		if code != abi.InvalidArgument {
			t.Errorf("%s: code %v (%s), want INVALID_ARGUMENT", tc.op, code, out)
		}
		if f.called != "" {
			t.Errorf("%s: backend's %s ran on a request that does not decode", tc.op, f.called)
		}
	}
}

func TestDispatchErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		code abi.Code
		msg  string
	}{
		{"abi error keeps its code", abi.Errorf(abi.AlreadyExists, "name taken"), abi.AlreadyExists, "name taken"},
		{"sdk.Errorf", Errorf(abi.ResourceExhausted, "pool full"), abi.ResourceExhausted, "pool full"},
		{"wrapped abi error keeps its code", fmt.Errorf("create pvc-1: %w", abi.Errorf(abi.NotFound, "source gone")), abi.NotFound, "create pvc-1: NOT_FOUND: source gone"},
		{"plain error is INTERNAL", errors.New("disk on fire"), abi.Internal, "disk on fire"},
		{"abi error with OK is INTERNAL", &abi.Error{Code: abi.OK, Message: "ok?"}, abi.Internal, "OK: ok?"},
		{"abi error with a garbage code is INTERNAL", &abi.Error{Code: 99, Message: "what"}, abi.Internal, "CODE(99): what"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, oc := range opCases() {
				f := &full{resp: oc.resp, err: tc.err}
				out, code := Dispatch(f, oc.op, encode(oc.req))
				if code != tc.code || string(out) != tc.msg {
					t.Errorf("%s: answered %v %q, want %v %q", oc.op, code, out, tc.code, tc.msg)
				}
			}
		})
	}
}

func TestDispatchBackendInfo(t *testing.T) {
	all := make([]string, len(abi.AllOps))
	for i, op := range abi.AllOps {
		all[i] = string(op)
	}
	for _, tc := range []struct {
		name string
		b    Backend
		want []string
	}{
		{"bare backend lists the required operations", &bare{info: abi.BackendInfo{Name: "b"}},
			[]string{"backend_info", "create_volume", "delete_volume"}},
		{"full backend lists every operation", &full{info: abi.BackendInfo{Name: "f"}}, all},
		{"explicit Ops are kept", &full{info: abi.BackendInfo{Name: "f", Ops: []string{"create_volume", "delete_volume"}}},
			[]string{"create_volume", "delete_volume"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, code := Dispatch(tc.b, abi.OpInfo, nil)
			if code != abi.OK {
				t.Fatalf("code %v: %s", code, out)
			}
			var info abi.BackendInfo
			if err := info.UnmarshalWire(out); err != nil {
				t.Fatal(err)
			}
			if info.Name != tc.b.Info().Name {
				t.Errorf("name %q, want %q", info.Name, tc.b.Info().Name)
			}
			if !slices.Equal(info.Ops, tc.want) {
				t.Errorf("ops %v\nwant %v", info.Ops, tc.want)
			}
			if !slices.Equal(Ops(tc.b), tc.want) && len(tc.b.Info().Ops) == 0 {
				t.Errorf("Ops() %v, want %v", Ops(tc.b), tc.want)
			}
		})
	}
}
