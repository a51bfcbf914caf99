# A wasmcsi volume for Nomad, created by the plugin of wasmcsi.nomad.hcl:
#
#   nomad volume create deploy/nomad/volume.hcl
#
# and claimed by a job with:
#
#   group "app" {
#     volume "data" {
#       type            = "csi"
#       source          = "data"
#       access_mode     = "single-node-writer"
#       attachment_mode = "file-system"
#     }
#     task "app" {
#       volume_mount {
#         volume      = "data"
#         destination = "/data"
#       }
#     }
#   }
id   = "data"
name = "data"
type = "csi"
# The plugin of the client the volume lives on: wasmcsi-<client> when the
# job runs with -var node=<client> (one plugin id per client, see
# deploy/README.md, "Nomad"); wasmcsi on a single client.
plugin_id = "wasmcsi"

capacity_min = "1GiB"
capacity_max = "2GiB"

capability {
  access_mode     = "single-node-writer"
  attachment_mode = "file-system"
}

# Keep this block when you create the volume again with a larger
# capacity_min to expand it: Nomad refuses other mount options for a volume
# in use, and stores an empty block for a spec without one.
mount_options {}

# The parameter names the backend module; the others go to the module.
# For loopfile, set mount_options { fs_type = "xfs" } (or "ext4").
parameters {
  "wasmcsi.dev/backend" = "localdir"
}

# The shipped backends are node-local: a volume lives on the client whose
# plugin created it (topology.wasmcsi.dev/node is that client's name, and
# Nomad places claiming allocations there). With one plugin id per client
# the create reaches that client; naming it here as well makes a create
# under a shared plugin id fail instead of landing elsewhere:
#
# topology_request {
#   required {
#     topology {
#       segments {
#         "topology.wasmcsi.dev/node" = "client-1"
#       }
#     }
#   }
# }
