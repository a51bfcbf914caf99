# A shared nfs volume for Nomad: every allocation that claims it, on any
# client, mounts it read-write at once (multi-node-multi-writer).
#
#   nomad volume create deploy/nomad/volume-nfs.hcl
#
# The plugin is the nfs driver's: a controller task on the storage host
# (nfs-kernel-server running, role controller) and node tasks on the
# clients (nfs-common, role node), both with plugin_id "wasmcsi-nfs" and
# the nfs module granted dir, nfsd, nfs and net (examples/nfs/README.md).
# The controller exports the volume's folder to a client when Nomad
# publishes the volume there and withdraws it when Nomad unpublishes it.
#
# Claim it with:
#
#   group "app" {
#     count = 3
#     volume "shared" {
#       type            = "csi"
#       source          = "shared"
#       access_mode     = "multi-node-multi-writer"
#       attachment_mode = "file-system"
#     }
#     task "app" {
#       volume_mount {
#         volume      = "shared"
#         destination = "/shared"
#       }
#     }
#   }
id        = "shared"
name      = "shared"
type      = "csi"
plugin_id = "wasmcsi-nfs"

capacity_min = "10GiB"
capacity_max = "10GiB"

capability {
  access_mode     = "multi-node-multi-writer"
  attachment_mode = "file-system"
}

# Passed to the node's NFS mount after the defaults soft,timeo=100,retrans=3.
mount_options {
  mount_flags = ["noatime"]
}

parameters {
  "wasmcsi.dev/backend" = "nfs"
  # server: a folder of the storage host's pool with an enforced quota,
  # exported to exactly the clients it is published to. For a folder of an
  # existing export instead (capacity advisory):
  #   mode     = "client"
  #   server   = "192.0.2.9"
  #   share    = "/export/nomad"
  #   onDelete = "archive"
  mode = "server"
}
