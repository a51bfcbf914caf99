package sdk

import "github.com/wasmcsi/wasmcsi/abi"

// Dispatch decodes req for op, calls the backend and encodes its answer.
// On failure it returns the error message and a non-OK code: an *abi.Error
// (also wrapped) keeps its code, any other error is INTERNAL, a request that does not decode
// is INVALID_ARGUMENT and an operation b does not implement UNIMPLEMENTED.
// The guest glue and native tests both go through Dispatch, so a module
// behaves the same in `go test` and in the daemon.
func Dispatch(b Backend, op abi.Op, req []byte) ([]byte, abi.Code) {
	if !Implements(b, op) {
		return []byte("operation " + string(op) + " is not implemented"), abi.Unimplemented
	}
	switch op {
	case abi.OpInfo:
		info := b.Info()
		if len(info.Ops) == 0 {
			info.Ops = Ops(b)
		}
		return info.AppendWire(nil), abi.OK
	case abi.OpConfigure:
		return run(req, &abi.ConfigureRequest{}, func(r *abi.ConfigureRequest) (abi.Message, error) {
			return empty(b.(Configurer).Configure(r))
		})
	case abi.OpCreateVolume:
		return run(req, &abi.CreateVolumeRequest{}, func(r *abi.CreateVolumeRequest) (abi.Message, error) {
			return nonNil(b.CreateVolume(r))
		})
	case abi.OpDeleteVolume:
		return run(req, &abi.DeleteVolumeRequest{}, func(r *abi.DeleteVolumeRequest) (abi.Message, error) {
			return empty(b.DeleteVolume(r))
		})
	case abi.OpExpandVolume:
		return run(req, &abi.ExpandVolumeRequest{}, func(r *abi.ExpandVolumeRequest) (abi.Message, error) {
			return nonNil(b.(Expander).ExpandVolume(r))
		})
	case abi.OpModifyVolume:
		return run(req, &abi.ModifyVolumeRequest{}, func(r *abi.ModifyVolumeRequest) (abi.Message, error) {
			return nonNil(b.(Modifier).ModifyVolume(r))
		})
	case abi.OpCreateSnapshot:
		return run(req, &abi.CreateSnapshotRequest{}, func(r *abi.CreateSnapshotRequest) (abi.Message, error) {
			return nonNil(b.(Snapshotter).CreateSnapshot(r))
		})
	case abi.OpDeleteSnapshot:
		return run(req, &abi.DeleteSnapshotRequest{}, func(r *abi.DeleteSnapshotRequest) (abi.Message, error) {
			return empty(b.(Snapshotter).DeleteSnapshot(r))
		})
	case abi.OpGetCapacity:
		return run(req, &abi.GetCapacityRequest{}, func(r *abi.GetCapacityRequest) (abi.Message, error) {
			return nonNil(b.(CapacityReporter).GetCapacity(r))
		})
	case abi.OpControllerPublish:
		return run(req, &abi.ControllerPublishRequest{}, func(r *abi.ControllerPublishRequest) (abi.Message, error) {
			return nonNil(b.(ControllerPublisher).ControllerPublish(r))
		})
	case abi.OpControllerUnpublish:
		return run(req, &abi.ControllerUnpublishRequest{}, func(r *abi.ControllerUnpublishRequest) (abi.Message, error) {
			return empty(b.(ControllerPublisher).ControllerUnpublish(r))
		})
	case abi.OpVolumeHealth:
		return run(req, &abi.VolumeHealthRequest{}, func(r *abi.VolumeHealthRequest) (abi.Message, error) {
			return nonNil(b.(VolumeHealthReporter).VolumeHealth(r))
		})
	case abi.OpStorageHealth:
		return run(req, &abi.Empty{}, func(*abi.Empty) (abi.Message, error) {
			return nonNil(b.(StorageHealthReporter).StorageHealth())
		})
	case abi.OpNodeInfo:
		return run(req, &abi.Empty{}, func(*abi.Empty) (abi.Message, error) {
			return nonNil(b.(NodeInformer).NodeInfo())
		})
	case abi.OpNodeStage:
		return run(req, &abi.NodeStageRequest{}, func(r *abi.NodeStageRequest) (abi.Message, error) {
			return nonNil(b.(NodeStager).NodeStage(r))
		})
	case abi.OpNodeUnstage:
		return run(req, &abi.NodeUnstageRequest{}, func(r *abi.NodeUnstageRequest) (abi.Message, error) {
			return empty(b.(NodeStager).NodeUnstage(r))
		})
	case abi.OpNodeExpand:
		return run(req, &abi.NodeExpandRequest{}, func(r *abi.NodeExpandRequest) (abi.Message, error) {
			return nonNil(b.(NodeExpander).NodeExpand(r))
		})
	case abi.OpSnapshotData:
		return run(req, &abi.SnapshotDataRequest{}, func(r *abi.SnapshotDataRequest) (abi.Message, error) {
			return nonNil(b.(SnapshotDataSource).SnapshotData(r))
		})
	}
	return []byte("unknown operation " + string(op)), abi.Unimplemented
}

func run[R any, PR interface {
	*R
	abi.Message
}](raw []byte, req PR, fn func(PR) (abi.Message, error)) ([]byte, abi.Code) {
	if err := req.UnmarshalWire(raw); err != nil {
		return []byte("bad request: " + err.Error()), abi.InvalidArgument
	}
	resp, err := fn(req)
	if err != nil {
		if e, ok := err.(*abi.Error); ok && e.Code != abi.OK && e.Code.Valid() {
			return []byte(e.Message), e.Code
		}
		// A wrapped *abi.Error (fmt.Errorf("...: %w", err)) keeps its code
		// too, as host-call errors do in the daemon.
		if c := abi.CodeOf(err); c != abi.OK && c != abi.Unknown && c.Valid() {
			return []byte(err.Error()), c
		}
		return []byte(err.Error()), abi.Internal
	}
	return resp.AppendWire(nil), abi.OK
}

func empty(err error) (abi.Message, error) { return &abi.Empty{}, err }

// nonNil turns a typed nil response into an empty message so that a
// backend returning (nil, nil) answers with zero values, not a crash.
func nonNil[T any, PT interface {
	*T
	abi.Message
}](resp PT, err error) (abi.Message, error) {
	if err != nil {
		return nil, err
	}
	if resp == nil {
		return PT(new(T)), nil
	}
	return resp, nil
}
