package abi

// Exports a module must have.
const (
	// ExportABIVersion is `(func (result i32))`, returning Version.
	ExportABIVersion = "wasmcsi_abi_version"
	// ExportInitialize is the wasip1 reactor initializer `(func)`; the host
	// calls it once per instance before anything else.
	ExportInitialize = "_initialize"
	// ExportMemory is the guest's linear memory.
	ExportMemory = "memory"
)

// Op names one operation a module may export. Every operation export has the
// signature `(func (result i32))`: it pulls its request with request_read,
// pushes its answer with response_write and returns a Code. A non-zero code
// makes the response bytes the UTF-8 error message.
type Op string

// The operations. Each is declared here once; its request and response are
// the signature of the sdk method of the same name (create_volume:
// CreateVolume, backend_info: Info), and `go generate` (internal/opgen)
// writes from the two AllOps (in the order below, which is the order of
// BackendInfo.Ops), sdk.Implements, sdk.Dispatch's cases and sdk/guest's
// exports.

const (
	// Load time.
	OpInfo      Op = "backend_info" // required: BackendInfo
	OpConfigure Op = "configure"    // ConfigureRequest -> Empty; first on every instance

	// Controller.
	OpCreateVolume        Op = "create_volume"
	OpDeleteVolume        Op = "delete_volume"
	OpExpandVolume        Op = "expand_volume"
	OpCreateSnapshot      Op = "create_snapshot"
	OpDeleteSnapshot      Op = "delete_snapshot"
	OpGetCapacity         Op = "get_capacity"
	OpControllerPublish   Op = "controller_publish"
	OpControllerUnpublish Op = "controller_unpublish"
	OpVolumeHealth        Op = "volume_health"
	OpModifyVolume        Op = "modify_volume"
	OpListOwned           Op = "list_owned"

	// Node.
	OpNodeInfo      Op = "node_info"
	OpNodeStage     Op = "node_stage"
	OpNodeUnstage   Op = "node_unstage"
	OpNodeExpand    Op = "node_expand"
	OpSnapshotData  Op = "snapshot_data"
	OpStorageHealth Op = "storage_health"
)

// Core imports of the "wasmcsi" host module. They need no grant.
const (
	// ImportRequestRead is `(func (param $buf i32) (param $limit i32) (result i32))`:
	// copies the current operation's request into buf when it fits in limit
	// and always returns its full length (limit 0 asks only for the length).
	ImportRequestRead = "request_read"
	// ImportResponseWrite is `(func (param $buf i32) (param $len i32))`: sets the
	// current operation's response (or error message); the last call wins.
	ImportResponseWrite = "response_write"
	// ImportResultRead is `(func (param $buf i32) (param $limit i32) (result i32))`:
	// copies the full result of the last host call (see HostCallSignature)
	// into buf when it fits and returns its length.
	ImportResultRead = "result_read"
	// ImportLog is `(func (param $level i32) (param $buf i32) (param $len i32))`:
	// writes one log line at a LogLevel.
	ImportLog = "log"
)

// LogLevel is the level argument of the log import.
type LogLevel int32

const (
	LogDebug LogLevel = -4
	LogInfo  LogLevel = 0
	LogWarn  LogLevel = 4
	LogError LogLevel = 8
)

// Every granted host call is an import of the "wasmcsi" module with one shape:
//
//	(func $name (param $req i32) (param $req_len i32) (param $out i32) (param $out_limit i32) (result i64))
//
// The request is an encoded message. The result packs the Code in the high 32
// bits and the length of the result (the encoded response, or the UTF-8 error
// message when the code is not OK) in the low 32 bits. The host writes the
// result to out only when it fits in out_limit; otherwise the guest fetches it
// with result_read, so a host call with side effects is never repeated just to
// get a larger buffer.
const HostCallSignature = "(i32 i32 i32 i32) -> i64"

// PackResult and UnpackResult implement the i64 result of a host call.
func PackResult(code Code, n uint32) uint64 { return uint64(code)<<32 | uint64(n) }

// UnpackResult splits a host call's i64 result.
func UnpackResult(r uint64) (Code, uint32) { return Code(r >> 32), uint32(r) }
