package abi

// Messages of the "iscsi" host calls: the node's iSCSI initiator. The
// family's roots are the portals a module may log in to: "ip:port" or
// "[ipv6]:port" (port 3260 when omitted), or an address prefix such as
// "192.0.2.0/24" that allows every portal in it. One session per (portal,
// target) is shared by every LUN in use on it and ends with the last
// iscsi_logout; the host keeps that count across daemon restarts.
// The codec is generated into hc_iscsi_wire.go. Field numbers are the wire
// contract: never renumber or reuse one.

// Host call names of the "iscsi" family.
const (
	// HostCallIscsiLogin logs in to a granted portal's target (sharing one session per
	// target between volumes) and answers the LUN's device.
	HostCallIscsiLogin = "iscsi_login" // IscsiTarget -> IscsiLoginResponse
	// HostCallIscsiLogout releases a LUN; the session ends with its last
	// user.
	HostCallIscsiLogout = "iscsi_logout" // IscsiTarget -> Empty
	// HostCallIscsiRescan makes the node see a grown LUN's new size.
	HostCallIscsiRescan = "iscsi_rescan" // IscsiTarget -> IscsiRescanResponse
	// HostCallIscsiInitiatorName answers the node's initiator name, which
	// a module reports in node_info so its controller can grant the node
	// access to a LUN. It needs no root.
	HostCallIscsiInitiatorName = "iscsi_initiator_name" // Empty -> IscsiInitiatorName.Name
)

// IscsiTarget names one LUN behind a target and how to log in to it.
//
//   - iscsi_login: logs in when no session to (Portal, IQN) exists, waits
//     for the LUN's block device and answers it; the same LUN again is
//     success. PERMISSION_DENIED when the target refuses this initiator or
//     its CHAP credentials (or the portal is not granted), UNAVAILABLE when
//     the portal does not answer, NOT_FOUND when the target does not
//     present the LUN to this initiator.
//   - iscsi_logout: deletes the LUN's device and logs out when no other LUN
//     uses the session; idempotent. FAILED_PRECONDITION while the device is
//     mounted or held. CHAP fields are ignored.
//   - iscsi_rescan: re-reads the LUN's capacity after the target grew it.
//     NOT_FOUND when the LUN is not logged in.
type IscsiTarget struct {
	Portal string `wire:"1"` // "ip[:port]" or "[ipv6][:port]"
	IQN    string `wire:"2"` // iqn., eui. or naa. name
	LUN    int32  `wire:"3"` // 0-255
	// ChapUser and ChapSecret, when set, are one-way CHAP credentials for
	// the login (user 1-255, secret 12-255 printable ASCII, no spaces).
	ChapUser   string `wire:"4"`
	ChapSecret string `wire:"5"`
}

// IscsiLoginResponse answers the LUN's block device: its
// /dev/disk/by-path link when udev makes one, else /dev/sdX.
type IscsiLoginResponse struct {
	Device string `wire:"1"`
}

// IscsiRescanResponse answers the LUN's size after the rescan.
type IscsiRescanResponse struct {
	SizeBytes int64 `wire:"1"`
}

// IscsiInitiatorName is the node's iSCSI initiator name, from open-iscsi's
// initiatorname.iscsi. FAILED_PRECONDITION when open-iscsi has no name file
// or the file has no InitiatorName line; INVALID_ARGUMENT when the name in
// it is not a valid iSCSI name.
type IscsiInitiatorName struct {
	Name string `wire:"1"`
}
