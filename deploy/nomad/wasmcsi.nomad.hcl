# wasmcsi on Nomad: one monolith plugin (controller and node in one daemon)
# on every client, as a system job.
#
#   nomad job run deploy/nomad/wasmcsi.nomad.hcl
#   nomad plugin status wasmcsi
#
# Each client needs, in its agent configuration:
#
#   plugin "docker" {
#     config {
#       allow_privileged = true   # the plugin mounts and attaches devices
#       volumes {
#         enabled = true          # bind-mounts /dev into the task
#       }
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
# Nomad sends CreateVolume to a controller of its own choosing, and the
# backends granted here are node-local: a volume is created on the client
# whose plugin got the call. With more than one client, run one copy of this
# job per client, each with its own plugin id (csi_plugin ids cannot be
# interpolated) and a constraint on ${node.unique.name}, and name that
# plugin id in the volume spec (see volume.hcl).
job "wasmcsi" {
  type        = "system"
  datacenters = ["*"]

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

    # Copies the modules baked into the image to the client's module folder
    # before the plugin starts (same-named files are replaced; others stay).
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
          "--recursive", "--preserve=mode,timestamps", "--remove-destination",
          "--no-target-directory", "/opt/wasmcsi/modules", "/var/lib/wasmcsi/modules",
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
        # The host's /dev, so that loop devices attached later show up.
        mount {
          type   = "bind"
          source = "/dev"
          target = "/dev"
        }
      }

      csi_plugin {
        id        = "wasmcsi"
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
