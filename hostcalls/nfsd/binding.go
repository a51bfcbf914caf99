package nfsd

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/wasmcsi/wasmcsi/abi"
	"github.com/wasmcsi/wasmcsi/hostcalls"
)

// Family is the grant that allows the nfsd host calls.
const Family = "nfsd"

// Bindings returns the "nfsd" host calls (abi/hc_nfsd.go) on s. The
// caller's roots are told apart by form: absolute folders, whose
// subfolders it may export, and IP addresses or prefixes, which the
// clients it names must lie in.
func Bindings(s *Server) []hostcalls.Func {
	b := &binder{s: s}
	// No Available: a node daemon loads the same module without an NFS
	// server; the calls answer FAILED_PRECONDITION there.
	return []hostcalls.Func{
		hostcalls.Typed(Family, abi.HostCallNfsdExport, b.export),
		hostcalls.Typed(Family, abi.HostCallNfsdUnexport, b.unexport),
		hostcalls.Typed(Family, abi.HostCallNfsdClientAdd, b.clientAdd),
		hostcalls.Typed(Family, abi.HostCallNfsdClientRemove, b.clientRemove),
		hostcalls.Typed(Family, abi.HostCallNfsdList, b.list),
	}
}

type binder struct{ s *Server }

// pathRoots are the caller's folder roots.
func pathRoots(roots []string) []string {
	var out []string
	for _, r := range roots {
		if strings.HasPrefix(r, "/") {
			out = append(out, r)
		}
	}
	return out
}

// exportPath confines p to a folder root (never a root itself) and checks
// it names a folder whose real path stays inside the roots.
func exportPath(env *hostcalls.Env, p string, mustExist bool) (string, error) {
	if err := ValidPath(p); err != nil {
		return "", err
	}
	roots := pathRoots(env.Roots)
	clean, err := hostcalls.Confine(roots, p, false)
	if err != nil {
		return "", err
	}
	if !mustExist {
		return clean, nil
	}
	real, err := evalSymlinks(clean)
	if errors.Is(err, os.ErrNotExist) {
		return "", abi.Errorf(abi.NotFound, "nfsd: folder %s does not exist", clean)
	} else if err != nil {
		return "", abi.Errorf(abi.Internal, "nfsd: folder %s: %v", clean, err)
	}
	if real != clean {
		// nfsd exports the real folder; a link in the way could lead it
		// out of the roots after the check.
		return "", abi.Errorf(abi.PermissionDenied, "nfsd: %s resolves to %s: export real folders only", clean, real)
	}
	st, err := os.Stat(real)
	if err != nil {
		return "", abi.Errorf(abi.Internal, "nfsd: folder %s: %v", clean, err)
	}
	if !st.IsDir() {
		return "", abi.Errorf(abi.InvalidArgument, "nfsd: %s is not a folder", clean)
	}
	return clean, nil
}

// grantedClient checks a client against the caller's client roots and
// answers it in normal form.
func grantedClient(env *hostcalls.Env, c abi.NfsdClient) (Client, error) {
	p, norm, err := ParseClient(c.Address)
	if err != nil {
		return Client{}, err
	}
	for _, r := range env.Roots {
		if strings.HasPrefix(r, "/") {
			continue
		}
		var root netip.Prefix
		if a, err := netip.ParseAddr(r); err == nil {
			root = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		} else if rp, err := netip.ParsePrefix(r); err == nil {
			root = rp.Masked()
		} else {
			continue
		}
		if root.Addr().Is4() == p.Addr().Is4() && root.Bits() <= p.Bits() && root.Contains(p.Addr()) {
			return Client{Address: norm, ReadOnly: c.ReadOnly}, nil
		}
	}
	return Client{}, abi.Errorf(abi.PermissionDenied, "nfsd: client %s is outside the granted client addresses", c.Address)
}

func (b *binder) answer(e *Export) (*abi.NfsdExport, error) {
	if e == nil {
		return &abi.NfsdExport{}, nil
	}
	active, err := b.s.Active()
	if err != nil {
		return nil, err
	}
	return toABI(*e, active), nil
}

func toABI(e Export, active map[string]map[string]bool) *abi.NfsdExport {
	out := &abi.NfsdExport{Path: e.Path, Active: true}
	for _, c := range e.Clients {
		out.Clients = append(out.Clients, abi.NfsdClient{Address: c.Address, ReadOnly: c.ReadOnly})
		if !active[e.Path][c.Address] {
			out.Active = false
		}
	}
	return out
}

func (b *binder) export(ctx context.Context, env *hostcalls.Env, req *abi.NfsdExportRequest) (*abi.NfsdExport, error) {
	p, err := exportPath(env, req.Path, true)
	if err != nil {
		return nil, err
	}
	var clients []Client
	for _, c := range req.Clients {
		cl, err := grantedClient(env, c)
		if err != nil {
			return nil, err
		}
		if slices.ContainsFunc(clients, func(x Client) bool { return x.Address == cl.Address }) {
			return nil, abi.Errorf(abi.InvalidArgument, "nfsd_export: client %s named twice", cl.Address)
		}
		clients = append(clients, cl)
	}
	sortClients(clients)
	e, err := b.s.Set(ctx, env.Module, p, func(*Export) *Export { return &Export{Path: p, Clients: clients} })
	if err != nil {
		return nil, err
	}
	if env.Log != nil {
		env.Log.Info("nfs export set", "path", p, "clients", len(clients))
	}
	return b.answer(e)
}

func (b *binder) unexport(ctx context.Context, env *hostcalls.Env, req *abi.NfsdRequest) (*abi.Empty, error) {
	p, err := exportPath(env, req.Path, false)
	if err != nil {
		return nil, err
	}
	if _, err := b.s.Set(ctx, env.Module, p, func(*Export) *Export { return nil }); err != nil {
		return nil, err
	}
	return &abi.Empty{}, nil
}

func (b *binder) clientAdd(ctx context.Context, env *hostcalls.Env, req *abi.NfsdClientRequest) (*abi.NfsdExport, error) {
	p, err := exportPath(env, req.Path, true)
	if err != nil {
		return nil, err
	}
	cl, err := grantedClient(env, req.Client)
	if err != nil {
		return nil, err
	}
	missing := false
	e, err := b.s.Set(ctx, env.Module, p, func(cur *Export) *Export {
		if cur == nil {
			missing = true
			return nil
		}
		next := Export{Path: cur.Path, Clients: slices.DeleteFunc(slices.Clone(cur.Clients), func(x Client) bool { return x.Address == cl.Address })}
		next.Clients = append(next.Clients, cl)
		sortClients(next.Clients)
		return &next
	})
	if err != nil {
		return nil, err
	}
	if missing {
		return nil, abi.Errorf(abi.NotFound, "nfsd_client_add: %s is not exported (nfsd_export first)", p)
	}
	if env.Log != nil {
		env.Log.Info("nfs export client added", "path", p, "client", cl.Address, "readOnly", cl.ReadOnly)
	}
	return b.answer(e)
}

func (b *binder) clientRemove(ctx context.Context, env *hostcalls.Env, req *abi.NfsdClientRequest) (*abi.NfsdExport, error) {
	p, err := exportPath(env, req.Path, false)
	if err != nil {
		return nil, err
	}
	// Removal needs no grant of the client: taking access away is always
	// allowed, and a root narrowed since must not keep a client in.
	_, norm, err := ParseClient(req.Client.Address)
	if err != nil {
		return nil, err
	}
	e, err := b.s.Set(ctx, env.Module, p, func(cur *Export) *Export {
		if cur == nil {
			return nil
		}
		next := Export{Path: cur.Path, Clients: slices.DeleteFunc(slices.Clone(cur.Clients), func(x Client) bool { return x.Address == norm })}
		return &next
	})
	if err != nil {
		return nil, err
	}
	if env.Log != nil {
		env.Log.Info("nfs export client removed", "path", p, "client", norm)
	}
	return b.answer(e)
}

func (b *binder) list(ctx context.Context, env *hostcalls.Env, req *abi.NfsdListRequest) (*abi.NfsdExports, error) {
	root, err := hostcalls.Confine(pathRoots(env.Roots), req.Root, true)
	if err != nil {
		return nil, err
	}
	exports, err := b.s.Load(env.Module)
	if err != nil {
		return nil, err
	}
	active, err := b.s.Active()
	if err != nil {
		return nil, err
	}
	out := &abi.NfsdExports{}
	out.Running, out.Reason = b.s.Running()
	for _, e := range exports {
		if strings.HasPrefix(e.Path, root+"/") {
			x := toABI(e, active)
			x.Active = x.Active && out.Running
			out.Exports = append(out.Exports, *x)
		}
	}
	return out, nil
}

func sortClients(cs []Client) {
	slices.SortFunc(cs, func(a, b Client) int { return strings.Compare(a.Address, b.Address) })
}
