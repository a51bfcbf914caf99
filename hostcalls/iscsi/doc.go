// Package iscsi is the node's iSCSI initiator: it logs in to targets,
// hands out the block device of each LUN, shares one session per (portal,
// target) among every volume that needs it, and logs a session out only when
// its last user is gone.
//
// It drives open-iscsi's iscsiadm as a program (there is no library for the
// iscsid protocol) with validated arguments and a timeout, and reads
// sessions, LUNs and devices from sysfs rather than parsing iscsiadm output.
// iscsid must be running; this package never starts it and never loads
// kernel modules.
//
// It must never run a shell, log out a session another recorded LUN still
// uses, delete the device of a LUN that is mounted or held, or put a CHAP
// secret into an error, a log line or a command line.
//
// # Rationale
//
// Who uses a session. A session to a target carries every LUN that target
// presents to this node, so several volumes can share it and logging it out
// for one would cut off the others. The package keeps, per (portal, IQN),
// the set of LUNs in use, in a small JSON file under the state directory
// given to New, written by temp file, fsync, rename and directory fsync.
// Deriving users from what is staged would need this package to know the
// host's staging layout and would make the iSCSI primitive depend on mount
// state; the kernel's view cannot serve either, because a login makes a
// device for every LUN the target presents, used or not. The file is the
// refcount; the kernel is checked against it.
//
// Order of steps. Login records the LUN before logging in, so a crash
// leaves a user that the CO's retry of NodeStage or NodeUnstage settles,
// never an unrecorded session that a later Logout of another LUN would cut.
// Logout deletes the LUN's SCSI device, then logs out if it was the last
// user, and drops the record last, so a failed step is retried by the CO's
// retry. Cleanup logs out sessions with no recorded user and no devices.
//
// Devices. Logout deletes the SCSI device of the LUN it releases (sysfs
// "delete", after an exclusive open proves nothing holds it and BLKFLSBUF
// flushes it); Login of a LUN on an existing session probes just that LUN
// (host "scan" with its channel, target and LUN). A LUN still missing after
// the probe is reported as NotFound at once instead of waiting out a
// timeout. Rescan re-reads the capacity of one LUN only (its "rescan"
// attribute); a session-wide "iscsiadm -R" would bring back devices of
// LUNs not in use here.
//
// Node records. Login writes the node record with node.startup=manual (the
// daemon decides when to log in, not iscsid at boot), short login timeouts
// (open-iscsi's defaults keep a login to a dead portal busy for two
// minutes) and the CHAP settings, and the last Logout deletes it so no
// secret stays on disk.
//
// CHAP secrets go into the record file, never on iscsiadm's command line.
// open-iscsi accepts a node setting in only two ways: "-o update -n NAME -v
// VALUE" on the command line, or the record file in its node database
// (/etc/iscsi/nodes or /var/lib/iscsi/nodes, "name = value" lines). A
// command line is world-readable in /proc/<pid>/cmdline for as long as the
// process lives, and ps, audit logs and process accounting copy it
// further; iscsiadm reads no secret from stdin or the environment. The
// record file is root's, and iscsiadm reads it at every login to hand the
// settings to iscsid. So Login runs "-o new" and "-o update" for the
// settings that are not secret, then finds the records of (target, portal)
// itself (the flat "<addr>,<port>" file that "-o new" writes, and the
// "<addr>,<port>,<tpgt>/<iface>" files discovery writes; an IPv6 address
// bare) and sets the authentication lines there: a temp file of mode 0600
// in the folder that holds the node database, fsync, rename, folder fsync,
// under the lock that serializes the node database, so iscsiadm sees the
// old record or the new one, never a torn one. The temp file is never
// inside the database, where open-iscsi would take one a crash left for a
// record of its own; the first CHAP login of an Initiator removes such
// leftovers. Of the default databases only the one iscsiadm uses gets the
// secret: the one whose records its "-o new" and "-o update" made or
// changed; a copy in the other would outlive "-o delete". Mutual-CHAP lines a new record may inherit from
// iscsid.conf are dropped, as the target asks for one-way CHAP. The
// record layout is open-iscsi's on-disk format, stable since 2.0-870 and
// checked against a real login in the VM tier.
package iscsi
