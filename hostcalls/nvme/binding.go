package nvme

import (
	"context"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/netaddr"
)

// Family is the grant that allows the nvme host calls.
const Family = "nvme"

// Bindings returns the "nvme" host calls (see abi/hc_nvme.go), served by
// in. The caller's roots are the addresses it may connect to: "ip:port",
// "[ipv6]:port" (port 4420 when omitted), or an address prefix such as
// "192.0.2.0/24" that allows every address in it.
func Bindings(in *Initiator) []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallNvmeConnect, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmeNamespace) (*abi.NvmeConnectResponse, error) {
			n, err := granted(env, req)
			if err != nil {
				return nil, err
			}
			dev, ctrl, err := in.Connect(ctx, n)
			if err != nil {
				return nil, err
			}
			if env.Log != nil {
				env.Log.Info("nvme namespace connected", "subsystem", n.Subsystem, "address", n.Addr.String(), "device", dev, "controller", ctrl)
			}
			return &abi.NvmeConnectResponse{Device: dev, Controller: ctrl}, nil
		}),
		hostcalls.Typed(Family, abi.HostCallNvmeDisconnect, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmeNamespace) (*abi.Empty, error) {
			n, err := granted(env, req)
			if err != nil {
				return nil, err
			}
			return &abi.Empty{}, in.Disconnect(ctx, n)
		}),
		hostcalls.Typed(Family, abi.HostCallNvmeRescan, func(ctx context.Context, env *hostcalls.Env, req *abi.NvmeNamespace) (*abi.NvmeRescanResponse, error) {
			n, err := granted(env, req)
			if err != nil {
				return nil, err
			}
			size, err := in.Rescan(ctx, n, req.MinSizeBytes)
			if err != nil {
				return nil, err
			}
			return &abi.NvmeRescanResponse{SizeBytes: size}, nil
		}),
		// The host NQN is a fact about the node, not a resource: it needs
		// no root, so a module granted "nvme" may always read it.
		hostcalls.Typed(Family, abi.HostCallNvmeHostNqn, func(ctx context.Context, env *hostcalls.Env, _ *abi.Empty) (*abi.NvmeHostNQN, error) {
			nqn, err := in.HostNQN()
			if err != nil {
				return nil, err
			}
			return &abi.NvmeHostNQN{NQN: nqn}, nil
		}),
	}
}

// granted checks a request and its address against the caller's roots.
func granted(env *hostcalls.Env, req *abi.NvmeNamespace) (Namespace, error) {
	if req.DHChapKey != "" {
		return Namespace{}, abi.Errorf(abi.Unimplemented, "nvme: DH-HMAC-CHAP is not supported yet")
	}
	ap, err := ParseAddr(req.Address)
	if err != nil {
		return Namespace{}, err
	}
	if !netaddr.Granted(env.Roots, ap, DefaultPort) {
		return Namespace{}, abi.Errorf(abi.PermissionDenied, "address %s is not granted", ap.String())
	}
	if err := ValidNQN(req.Subsystem); err != nil {
		return Namespace{}, err
	}
	u, err := ParseUUID(req.UUID)
	if err != nil {
		return Namespace{}, err
	}
	return Namespace{Addr: ap, Subsystem: req.Subsystem, UUID: u}, nil
}
