package iscsi

import (
	"context"
	"github.com/wasmcsi/wasmcsi/hostcalls/internal/netaddr"
	"net/netip"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the iscsi host calls.
const Family = "iscsi"

// Bindings returns the "iscsi" host calls (see abi/hc_iscsi.go), served by
// in, the daemon's one Initiator (its user record must be shared by every
// module). The caller's roots are the portals it may log in to: "ip:port",
// "[ipv6]:port" (port 3260 when omitted), or an address prefix such as
// "192.0.2.0/24" that allows every portal in it.
func Bindings(in *Initiator) []hostcalls.Func {
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallIscsiLogin, func(ctx context.Context, env *hostcalls.Env, req *abi.IscsiTarget) (*abi.IscsiLoginResponse, error) {
			t, err := grantedTarget(env, req)
			if err != nil {
				return nil, err
			}
			dev, err := in.Login(ctx, t)
			if err != nil {
				return nil, err
			}
			return &abi.IscsiLoginResponse{Device: dev}, nil
		}),
		hostcalls.Typed(Family, abi.HostCallIscsiLogout, func(ctx context.Context, env *hostcalls.Env, req *abi.IscsiTarget) (*abi.Empty, error) {
			t, err := grantedTarget(env, req)
			if err != nil {
				return nil, err
			}
			return &abi.Empty{}, in.Logout(ctx, t)
		}),
		hostcalls.Typed(Family, abi.HostCallIscsiRescan, func(ctx context.Context, env *hostcalls.Env, req *abi.IscsiTarget) (*abi.IscsiRescanResponse, error) {
			t, err := grantedTarget(env, req)
			if err != nil {
				return nil, err
			}
			size, err := in.Rescan(ctx, t)
			if err != nil {
				return nil, err
			}
			return &abi.IscsiRescanResponse{SizeBytes: size}, nil
		}),
		// The initiator name is a fact about the node, not a resource: it
		// needs no root, so a module granted "iscsi" may always read it.
		hostcalls.Typed(Family, abi.HostCallIscsiInitiatorName, func(ctx context.Context, env *hostcalls.Env, _ *abi.Empty) (*abi.IscsiInitiatorName, error) {
			name, err := in.InitiatorName(ctx)
			if err != nil {
				return nil, err
			}
			return &abi.IscsiInitiatorName{Name: name}, nil
		}),
	}
}

// grantedTarget turns a request into a Target whose portal the caller's
// roots allow.
func grantedTarget(env *hostcalls.Env, req *abi.IscsiTarget) (Target, error) {
	ap, err := ParsePortal(req.Portal)
	if err != nil {
		return Target{}, err
	}
	if !portalGranted(env.Roots, ap) {
		return Target{}, abi.Errorf(abi.PermissionDenied, "portal %s is not granted", ap.String())
	}
	t := Target{Portal: req.Portal, IQN: req.IQN, LUN: int(req.LUN)}
	if req.ChapUser != "" || req.ChapSecret != "" {
		t.CHAP = &CHAP{User: req.ChapUser, Secret: req.ChapSecret}
	}
	return t, nil
}

// portalGranted reports whether one of roots allows ap: an equal portal,
// or an address prefix ("a.b.c.d/n", "x::/n") that contains its address.
// Roots that parse as neither allow nothing.
func portalGranted(roots []string, ap netip.AddrPort) bool {
	return netaddr.Granted(roots, ap, DefaultPort)
}
