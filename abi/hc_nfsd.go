package abi

// Messages of the "nfsd" host calls: serving folders over NFS with the
// kernel's nfsd on the storage host. The family's roots are of two kinds,
// told apart by their form: absolute folders ("/srv/nfs/pool"), whose
// subfolders may be exported (a root itself never is), and client
// addresses or prefixes ("192.0.2.0/24", "fd00::/64", "192.0.2.7") that an
// export may name as clients. An export names its clients one by one (IP
// addresses, never a host name, a netgroup, a wildcard or "*"), so a node
// that is not listed cannot mount it, and a node taken off the list loses
// access at once, also through a mount it already has (fencing).
//
// The host keeps each module's exports in a file of its own under
// /etc/exports.d, written whole and fsynced before the kernel is told, and
// applies them again when the daemon starts: exports survive a daemon
// restart, a reboot and a restart of the NFS server, and the file is the
// record of which client may reach which folder. Every call is idempotent.
// The codec is generated into hc_nfsd_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "nfsd" family.
const (
	// HostCallNfsdExport exports a folder to exactly the clients named,
	// creating the export or replacing its client list.
	HostCallNfsdExport = "nfsd_export" // NfsdExportRequest -> NfsdExport
	// HostCallNfsdUnexport withdraws a folder's export from every client.
	HostCallNfsdUnexport = "nfsd_unexport" // NfsdRequest{path} -> Empty
	// HostCallNfsdClientAdd lets one more client reach an export.
	HostCallNfsdClientAdd = "nfsd_client_add" // NfsdClientRequest -> NfsdExport
	// HostCallNfsdClientRemove takes one client's access to an export away.
	HostCallNfsdClientRemove = "nfsd_client_remove" // NfsdClientRequest -> NfsdExport
	// HostCallNfsdList lists the module's exports under one of its roots,
	// and whether the server runs.
	HostCallNfsdList = "nfsd_list" // NfsdListRequest -> NfsdExports
)

// NfsdClient is one client of an export: an IPv4 or IPv6 address, or a
// prefix ("192.0.2.0/24") for a network the operator trusts as a whole;
// either lies inside a granted client root. ReadOnly exports to it
// read-only.
type NfsdClient struct {
	Address  string `wire:"1"`
	ReadOnly bool   `wire:"2"`
}

// NfsdExportRequest exports Path, a folder under a granted folder root
// (not the root itself), to exactly Clients: a client not in the list
// loses its access. An empty list keeps the export's record with no
// client, so that nobody can reach it. The host chooses the export options
// (sync, no_subtree_check, no_root_squash, sec=sys, and an fsid derived
// from Path, stable across restarts); the module chooses only the clients
// and their access. NOT_FOUND when Path is not a folder,
// FAILED_PRECONDITION when the server's tools (exportfs) are missing.
type NfsdExportRequest struct {
	Path    string       `wire:"1"`
	Clients []NfsdClient `wire:"2"`
}

// NfsdRequest names an export by its folder.
//
//   - nfsd_unexport: withdraws the export from every client and forgets
//     it. An export that does not exist is success.
type NfsdRequest struct {
	Path string `wire:"1"`
}

// NfsdClientRequest names one client of an export.
//
//   - nfsd_client_add: adds Client (or changes its ReadOnly) and answers
//     the export. NOT_FOUND when Path has no export (nfsd_export first).
//   - nfsd_client_remove: removes Client; the kernel drops what it
//     cached for it, so its next operation on the export fails even
//     through a mount it holds. A client that is not listed, or an export
//     that does not exist, is success.
type NfsdClientRequest struct {
	Path   string     `wire:"1"`
	Client NfsdClient `wire:"2"`
}

// NfsdExport is one export as the host recorded it and, in Active, as the
// kernel serves it: false when the record is there but the server does not
// serve it (nfsd stopped, or the folder is gone).
type NfsdExport struct {
	Path    string       `wire:"1"`
	Clients []NfsdClient `wire:"2"`
	Active  bool         `wire:"3"`
}

// NfsdListRequest lists the module's exports whose folder lies under Root,
// a granted folder root.
type NfsdListRequest struct {
	Root string `wire:"1"`
}

// NfsdExports answers nfsd_list: the exports in byte order of their
// folders, and whether the kernel's NFS server is running (nfsd has
// threads); Reason says why not.
type NfsdExports struct {
	Exports []NfsdExport `wire:"1"`
	Running bool         `wire:"2"`
	Reason  string       `wire:"3"`
}
