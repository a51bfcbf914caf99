package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/catalog"
	"github.com/wasmcsi/wasmcsi/modules"
)

// opMessages returns a new request and response of op.
func opMessages(op abi.Op) (req, resp abi.Message, ok bool) {
	switch op {
	case abi.OpInfo, abi.OpNodeInfo, abi.OpStorageHealth:
		req = &abi.Empty{}
	case abi.OpConfigure:
		req = &abi.ConfigureRequest{}
	case abi.OpCreateVolume:
		req = &abi.CreateVolumeRequest{}
	case abi.OpDeleteVolume:
		req = &abi.DeleteVolumeRequest{}
	case abi.OpExpandVolume:
		req = &abi.ExpandVolumeRequest{}
	case abi.OpCreateSnapshot:
		req = &abi.CreateSnapshotRequest{}
	case abi.OpDeleteSnapshot:
		req = &abi.DeleteSnapshotRequest{}
	case abi.OpGetCapacity:
		req = &abi.GetCapacityRequest{}
	case abi.OpControllerPublish:
		req = &abi.ControllerPublishRequest{}
	case abi.OpControllerUnpublish:
		req = &abi.ControllerUnpublishRequest{}
	case abi.OpVolumeHealth:
		req = &abi.VolumeHealthRequest{}
	case abi.OpModifyVolume:
		req = &abi.ModifyVolumeRequest{}
	case abi.OpNodeStage:
		req = &abi.NodeStageRequest{}
	case abi.OpNodeUnstage:
		req = &abi.NodeUnstageRequest{}
	case abi.OpNodeExpand:
		req = &abi.NodeExpandRequest{}
	case abi.OpSnapshotData:
		req = &abi.SnapshotDataRequest{}
	default:
		return nil, nil, false
	}
	switch op {
	case abi.OpInfo:
		resp = &abi.BackendInfo{}
	case abi.OpCreateVolume:
		resp = &abi.CreateVolumeResponse{}
	case abi.OpExpandVolume:
		resp = &abi.ExpandVolumeResponse{}
	case abi.OpModifyVolume:
		resp = &abi.ModifyVolumeResponse{}
	case abi.OpCreateSnapshot:
		resp = &abi.CreateSnapshotResponse{}
	case abi.OpGetCapacity:
		resp = &abi.GetCapacityResponse{}
	case abi.OpControllerPublish:
		resp = &abi.ControllerPublishResponse{}
	case abi.OpVolumeHealth, abi.OpStorageHealth:
		resp = &abi.HealthResponse{}
	case abi.OpNodeInfo:
		resp = &abi.NodeInfoResponse{}
	case abi.OpNodeStage:
		resp = &abi.NodeStageResponse{}
	case abi.OpNodeExpand:
		resp = &abi.NodeExpandResponse{}
	case abi.OpSnapshotData:
		resp = &abi.SnapshotDataResponse{}
	default:
		resp = &abi.Empty{}
	}
	return req, resp, true
}

// modulesCall runs one operation of a built module:
// wasmcsi modules call FILE OP [JSON].
func modulesCall(ctx context.Context, args []string, out, errOut io.Writer) error {
	flags := pflag.NewFlagSet("wasmcsi modules call", pflag.ContinueOnError)
	flags.SetOutput(errOut)
	name := flags.String("name", "", "the module's name (default: the file's name without .wasm or .tinygo.wasm)")
	useReal := flags.Bool("real", false, "answer host calls with the daemon's real ones (root for loop devices, mounts, device-mapper, iSCSI) instead of the fake host")
	families := flags.StringSlice("hostcalls", nil, "the granted host-call families (default with the fake host: all; required with --real)")
	roots := flags.StringSlice("root", nil, "a granted root, repeatable (default with the fake host: /pool; required with --real)")
	config := flags.StringToString("config", nil, "the module's configuration, key=value,...")
	nodeID := flags.String("node-id", "wasmcsi-call", "the node ID configure receives")
	flags.Usage = func() {
		fmt.Fprint(errOut, `Usage: wasmcsi modules call FILE OP [JSON] [flags]

runs one operation (create_volume, node_stage, backend_info, ...) of a built
module as the daemon would: loaded with the grant, configure first, then OP
with JSON as its request (abi's message, field names as in Go, e.g.
'{"Name": "pvc-1", "RequiredBytes": 1048576}'; default {}). Prints the
answer as JSON, or the error's code and message (and exits 1). The fake
host answers every host call with success and an empty answer and logs
each call on stderr.

`)
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	if flags.NArg() < 2 || flags.NArg() > 3 {
		flags.Usage()
		return errors.New("modules call: want FILE OP [JSON]")
	}
	file, op := flags.Arg(0), abi.Op(flags.Arg(1))
	body := "{}"
	if flags.NArg() == 3 {
		body = flags.Arg(2)
	}
	req, resp, ok := opMessages(op)
	if !ok {
		var ops []string
		for _, o := range abi.AllOps {
			ops = append(ops, string(o))
		}
		return fmt.Errorf("modules call: unknown operation %q (%s)", op, strings.Join(ops, ", "))
	}
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(req); err != nil {
		return fmt.Errorf("modules call: request of %s: %w", op, err)
	}
	if *name == "" {
		*name = strings.TrimSuffix(strings.TrimSuffix(filepath.Base(file), modules.TinyGoSuffix), ".wasm")
	}
	grant := modules.Grant{HostCalls: *families, Roots: *roots, Config: *config}
	var funcs map[string]hostcalls.Func
	if *useReal {
		if len(grant.HostCalls) == 0 || len(grant.Roots) == 0 {
			return errors.New("modules call: --real needs --hostcalls and --root: the grant the operator would write")
		}
		funcs = catalog.All()
	} else {
		funcs = fakeHost(errOut)
		if len(grant.Roots) == 0 {
			grant.Roots = []string{"/pool"}
		}
		if len(grant.HostCalls) == 0 {
			for _, d := range abi.HostCalls {
				if !slices.Contains(grant.HostCalls, d.Family) {
					grant.HostCalls = append(grant.HostCalls, d.Family)
				}
			}
		}
	}
	rt, m, err := loadOne(ctx, file, *name, grant, funcs, *nodeID, errOut, false)
	if err != nil {
		return err
	}
	defer rt.Close(context.Background())
	answer, err := m.Call(ctx, op, req.AppendWire(nil))
	if err != nil {
		return fmt.Errorf("%s: %s: %w", *name, op, err)
	}
	if err := resp.UnmarshalWire(answer); err != nil {
		return fmt.Errorf("%s: %s: the answer does not decode: %w", *name, op, err)
	}
	b, err := json.MarshalIndent(resp, "", "  ")
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s\n", b)
	return err
}

// loadOne loads file as module name into a runtime of its own, as the
// daemon does: checked against grant and funcs, configure first (replayed
// on every instance). With lenient a failing configure is only reported
// on errOut. The caller closes the runtime.
func loadOne(ctx context.Context, file, name string, grant modules.Grant, funcs map[string]hostcalls.Func, nodeID string, errOut io.Writer, lenient bool) (*modules.Runtime, *modules.Module, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "wasmcsi-call-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.WriteFile(filepath.Join(dir, name+".wasm"), data, 0o644); err != nil {
		return nil, nil, err
	}
	log := slog.New(slog.NewTextHandler(errOut, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rt, err := modules.New(ctx, modules.Config{
		Dir:       dir,
		Limits:    modules.Limits{CallTimeout: 10 * time.Second, MemoryPages: 4096, PoolSize: 1, AcquireTimeout: 5 * time.Second},
		Grants:    map[string]modules.Grant{name: grant},
		HostCalls: funcs,
		Log:       log,
		OnLoad: func(ctx context.Context, m *modules.Module) error {
			// As the daemon does: configure, replayed on every instance.
			if !m.Has(abi.OpConfigure) {
				return nil
			}
			creq := &abi.ConfigureRequest{Config: grant.Config, Roots: grant.Roots, NodeID: nodeID, Role: "all"}
			_, err := m.Call(ctx, abi.OpConfigure, creq.AppendWire(nil))
			switch {
			case err == nil:
				m.SetInstanceSetup(abi.OpConfigure, creq.AppendWire(nil))
			case abi.CodeOf(err) == abi.Unimplemented:
			case lenient:
				fmt.Fprintf(errOut, "%s: configure without its operator's configuration: %v\n", name, err)
			default:
				return fmt.Errorf("configure: %w", err)
			}
			return nil
		},
	})
	if err != nil {
		return nil, nil, err
	}
	if errs := rt.Load(ctx); errs[name] != nil {
		rt.Close(context.Background())
		return nil, nil, errs[name]
	}
	m, ok := rt.Module(name)
	if !ok {
		rt.Close(context.Background())
		return nil, nil, fmt.Errorf("module %s did not load", name)
	}
	return rt, m, nil
}

// fakeHost answers every host call the daemon offers with success and an
// empty answer (the zero message), and says so on w.
func fakeHost(w io.Writer) map[string]hostcalls.Func {
	funcs := map[string]hostcalls.Func{}
	for _, d := range abi.HostCalls {
		d := d
		funcs[d.Name] = hostcalls.Func{Name: d.Name, Family: d.Family, Call: func(_ context.Context, _ *hostcalls.Env, req []byte) ([]byte, error) {
			fmt.Fprintf(w, "fake host: %s (%s, %d bytes) -> OK, empty %s\n", d.Name, d.Request, len(req), d.Response)
			return nil, nil
		}}
	}
	return funcs
}
