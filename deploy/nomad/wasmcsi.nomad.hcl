# wasmcsi on Nomad in a container: a monolith plugin (controller and node in
# one daemon) run by the docker driver. Without Docker, see
# wasmcsi-raw.nomad.hcl.
#
#   nomad job run -var node=client-1 deploy/nomad/wasmcsi.nomad.hcl
#   nomad plugin status wasmcsi-client-1
#
# Each client needs, in its agent configuration:
#
#   plugin "docker" {
#     config {
#       allow_privileged = true   # the plugin mounts and attaches devices
#     }
#   }
#   client {
#     host_volume "wasmcsi-state"   { path = "/var/lib/wasmcsi/state" }
#     host_volume "wasmcsi-cache"   { path = "/var/lib/wasmcsi/cache" }
#     host_volume "wasmcsi-modules" { path = "/var/lib/wasmcsi/modules" }
#     host_volume "wasmcsi-pools"   { path = "/var/lib/wasmcsi/pools" }
#   }
#
# (the folders must exist: mkdir -p /var/lib/wasmcsi/{state,cache,modules,pools}).
#
# Nomad sends every controller call (CreateVolume, DeleteVolume, expansion,
# snapshots) to any client running a controller of the volume's plugin id,
# and the backends granted here are node-local. So every client gets a
# plugin id of its own: run this job once per client with -var node=<its
# name>; the job is then wasmcsi-<node>, runs only there and registers plugin
# wasmcsi-<node>, which volumes on that client name as plugin_id (see
# volume.hcl and deploy/README.md, "Nomad"). Without -var node the job runs
# on every client under the one plugin id "wasmcsi": right for a single
# client only.

variable "node" {
  type        = string
  default     = ""
  description = "the client (node.unique.name) this copy serves; empty: every client, plugin id wasmcsi"
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

  # One client at a time: two daemons must never share a client's state.
  update {
    max_parallel = 1
    stagger      = "30s"
  }

  group "wasmcsi" {
    volume "state" {
      type   = "host"
      source = "wasmcsi-state"
    }
    volume "cache" {
      type   = "host"
      source = "wasmcsi-cache"
    }
    volume "modules" {
      type   = "host"
      source = "wasmcsi-modules"
    }
    volume "pools" {
      type   = "host"
      source = "wasmcsi-pools"
    }

    network {
      port "metrics" {
        static = 9810
      }
    }

    # Copies the modules granted below from the image to the client's module
    # folder before the plugin starts (same-named files are replaced; others
    # stay). The image's iscsi module is left out: it needs a controller
    # publish step the node-local plugin does not take part in.
    task "install-modules" {
      lifecycle {
        hook    = "prestart"
        sidecar = false
      }
      driver = "docker"
      config {
        image      = "wasmcsi/wasmcsi:dev"
        entrypoint = ["cp"]
        args = [
          "--preserve=mode,timestamps", "--remove-destination",
          "--target-directory=/var/lib/wasmcsi/modules",
          "/opt/wasmcsi/modules/localdir.wasm",
          "/opt/wasmcsi/modules/loopfile.wasm",
          "/opt/wasmcsi/modules/dmthin.wasm",
        ]
      }
      volume_mount {
        volume      = "modules"
        destination = "/var/lib/wasmcsi/modules"
      }
      resources {
        cpu    = 50
        memory = 32
      }
    }

    task "plugin" {
      driver = "docker"
      config {
        image      = "wasmcsi/wasmcsi:dev"
        args       = ["serve", "--config", "/local/config.yaml"]
        privileged = true
        ports      = ["metrics"]
        # No /dev mount here: Nomad bind-mounts the host's /dev into every
        # CSI plugin task itself (loop devices attached later show up); a
        # mount of the job's own at /dev would duplicate that one.
      }

      csi_plugin {
        id        = local.plugin_id
        type      = "monolith"
        mount_dir = "/csi"
      }

      env {
        CSI_ENDPOINT    = "unix:///csi/csi.sock"
        WASMCSI_NODE_ID = "${node.unique.name}"
      }

      # The daemon's configuration; every key is documented by
      # `wasmcsi config`. Changing it restarts the task.
      template {
        destination = "local/config.yaml"
        change_mode = "restart"
        data        = <<EOF
driver_name: wasmcsi.dev
role: all
state_dir: /var/lib/wasmcsi/state
module_dir: /var/lib/wasmcsi/modules
cache_dir: /var/lib/wasmcsi/cache
watch_modules: true
metrics_address: ":9810"
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
    roots: [/var/lib/wasmcsi/pools/localdir]
    config: {}
  loopfile:
    sha256: ""
    hostcalls: [file, loop]
    roots: [/var/lib/wasmcsi/pools/loopfile]
    config: {}
  dmthin:
    sha256: ""
    hostcalls: [dm, file, loop]
    roots: [/var/lib/wasmcsi/pools/dmthin, wasmcsi-, /dev/mapper/wasmcsi-]
    config:
      pool: wasmcsi-thin
      data_device: data.img
      metadata_device: meta.img
      data_size: 10Gi
      metadata_size: 64Mi
EOF
      }

      volume_mount {
        volume      = "state"
        destination = "/var/lib/wasmcsi/state"
      }
      volume_mount {
        volume      = "cache"
        destination = "/var/lib/wasmcsi/cache"
      }
      volume_mount {
        volume      = "modules"
        destination = "/var/lib/wasmcsi/modules"
        read_only   = true
      }
      volume_mount {
        volume           = "pools"
        destination      = "/var/lib/wasmcsi/pools"
        propagation_mode = "host-to-task"
      }

      # Each module keeps up to limits.pool_size instances (a few MiB each
      # for TinyGo and standard Go guests); compiling a module takes more.
      resources {
        cpu    = 200
        memory = 512
      }
    }
  }
}
