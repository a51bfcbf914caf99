// Package faulttest holds the daemon's power-loss and disk-fault tiers.
// Both run inside the VM tier's guest (make test-faults, or
// bash .ci/vm/test.sh ./host/faulttest), as root, on device-mapper targets
// the host kernel may lack.
//
// The power-loss tier puts the daemon's state folder and its pools (the
// localdir and loopfile pools, and a dm-thin pool whose data and metadata
// are files in the dmthin module's state folder) on a dm-log-writes
// device, drives a workload of every controller and node call (create,
// clone, restore, snapshot, group snapshot, expand on the controller and
// the node, modify, stage, publish, the pod's writes, and the deletions)
// through gRPC (the real wasmcsi binary, started by daemontest),
// marks in the log where each call began and was answered, then replays
// the log (host/internal/logwrites) to each flush and FUA entry, the
// states a power cut could leave, starts the daemon on each and checks
// what the CO was told against what it finds.
//
// The disk-fault tier puts pools on dm-flakey and dm-error devices and on
// filesystems too small for what is asked, injects I/O errors and lack of
// space during each call that writes, and checks the answers' codes, that
// nothing unacknowledged is kept, that other backends keep serving and
// that the CO's retries succeed once the fault clears. A dm-thin pool of a
// few MiB is filled to the last data block and then to the last metadata
// block (TestThinPoolFaults); each time the operator grows the device
// that ran out and the retries must succeed.
//
// Everything lives in the test files; this file only holds the package
// comment. The tests skip with the reason outside the VM tier and release
// every mount, loop and device-mapper device they made, also on failure.
package faulttest
