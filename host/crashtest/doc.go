// Package crashtest is the daemon's crash test: it runs the real wasmcsi
// binary as a child process, drives it over gRPC with a mixed CSI workload
// (create, snapshot, clone, restore, stage, publish, unpublish, unstage,
// expand, delete; localdir and loopfile, mount and block), kills it with
// SIGKILL at random points (mostly while calls are in flight, also between
// calls and during start-up; with its child processes, or alone as the
// OOM killer would), restarts it, retries the calls that were cut off the
// way a CO does (or undoes a cut-off NodeStage or NodePublish, as kubelet
// does when the pod goes away meanwhile), and checks what a user of the
// volumes would notice:
// acknowledged volumes and snapshots listed and usable, their data intact,
// snapshots' data in their restores, and, after everything is deleted
// through CSI, no mount, loop device, pool file or record left behind.
//
// Everything lives in the test files; this file only holds the package
// comment. The test needs root and loop devices and skips without them.
// make test spreads its kill points over four seeds, each on a daemon of
// its own; `make crash KILLS=N` runs one longer round; WASMCSI_CRASH_SEED
// repeats one's choices (WASMCSI_CRASH_SEEDS sets the number of seeds);
// WASMCSI_CRASH_KEEP keeps a failed run's folder.
// It must never touch anything outside its own temporary folder, and it
// releases everything under it when it ends, also when it fails.
package crashtest
