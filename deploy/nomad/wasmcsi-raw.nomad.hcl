# wasmcsi on Nomad without Docker: the daemon runs on the client itself as a
# raw_exec task, a monolith plugin (controller and node in one daemon).
#
#   nomad job run -var node=client-1 deploy/nomad/wasmcsi-raw.nomad.hcl
#   nomad plugin status wasmcsi-client-1
#
# The client needs raw_exec enabled in its agent configuration:
#
#   plugin "raw_exec" {
#     config { enabled = true }
#   }
#
# and the binary and modules in place (make build; then install bin/wasmcsi
# as var.wasmcsi and bin/modules/*.wasm into var.module_dir).
#
# The shipped backends are node-local, and Nomad sends each controller call
# (CreateVolume, DeleteVolume, expansion, snapshots) to any client running a
# controller of the volume's plugin id. So every client gets a plugin id of
# its own: run this job once per client with -var node=<its name>; the job
# is then wasmcsi-<node>, runs only there and registers plugin
# wasmcsi-<node>, which volumes on that client name as plugin_id (see
# volume.hcl and deploy/README.md, "Nomad"). Without -var node the job runs
# on every client under the one plugin id "wasmcsi": right for a single
# client only.

variable "node" {
  type        = string
  default     = ""
  description = "the client (node.unique.name) this copy serves; empty: every client, plugin id wasmcsi"
}

variable "nomad_data_dir" {
  type        = string
  default     = "/opt/nomad/data"
  description = "the client's data_dir: Nomad hands the plugin staging and target paths below it"
}

variable "wasmcsi" {
  type    = string
  default = "/usr/local/bin/wasmcsi"
}

variable "module_dir" {
  type    = string
  default = "/var/lib/wasmcsi/modules"
}

variable "root" {
  type        = string
  default     = "/var/lib/wasmcsi"
  description = "holds state/ (one daemon per folder), cache/ and pools/<backend>/"
}

locals {
  plugin_id = var.node == "" ? "wasmcsi" : "wasmcsi-${var.node}"
}

job "wasmcsi" {
  id          = local.plugin_id
  type        = "system"
  datacenters = ["*"]

  constraint {
    attribute = "${node.unique.name}"
    operator  = var.node == "" ? "is_set" : "="
    value     = var.node
  }

  group "wasmcsi" {
    # Records, mounts and loop devices outlive the daemon; a restart takes
    # over where the last one stopped.
    restart {
      attempts = 10
      interval = "5m"
      delay    = "2s"
      mode     = "delay"
    }

    task "plugin" {
      driver = "raw_exec"
      config {
        command = var.wasmcsi
        args    = ["serve", "--config", "${NOMAD_TASK_DIR}/config.yaml"]
      }

      csi_plugin {
        id   = local.plugin_id
        type = "monolith"
        # raw_exec has no filesystem isolation: Nomad passes the plugin host
        # paths below this folder (the client's data_dir, csi/monolith/<id>)
        # and sets CSI_ENDPOINT to the socket's host path itself. Nomad
        # adds nothing else; /dev is the host's.
        stage_publish_base_dir = "${var.nomad_data_dir}/client/csi/monolith/${local.plugin_id}"
      }

      env {
        WASMCSI_NODE_ID = "${node.unique.name}"
      }

      # SIGINT first: the daemon finishes calls in flight and closes its
      # records.
      kill_timeout = "30s"

      # The daemon's configuration; every key is documented by
      # `wasmcsi config`. Changing it restarts the task.
      template {
        destination = "local/config.yaml"
        change_mode = "restart"
        data        = <<-EOT
          driver_name: wasmcsi.dev
          role: all
          state_dir: ${var.root}/state
          module_dir: ${var.module_dir}
          cache_dir: ${var.root}/cache
          watch_modules: true
          backend_parameter: wasmcsi.dev/backend
          default_backend: ""
          log_level: info
          log_format: json
          reconcile:
            clean: false
          modules:
            localdir:
              sha256: ""
              hostcalls: [dir]
              roots: [${var.root}/pools/localdir]
              config: {}
            loopfile:
              sha256: ""
              hostcalls: [file, loop]
              roots: [${var.root}/pools/loopfile]
              config: {}
            dmthin:
              sha256: ""
              hostcalls: [dm, file, loop]
              roots: [${var.root}/pools/dmthin, wasmcsi-, /dev/mapper/wasmcsi-]
              config:
                pool: wasmcsi-thin
                data_device: data.img
                metadata_device: meta.img
                data_size: 10Gi
                metadata_size: 64Mi
          EOT
      }

      resources {
        cpu    = 200
        memory = 512
      }
    }
  }
}
