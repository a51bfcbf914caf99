;; hugemax: declares a maximum memory of 4 GiB; the host's limit wins.
;; create_volume grows memory until the host refuses, then fails cleanly with
;; RESOURCE_EXHAUSTED and the page count it reached (i32) as its message.
(module
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))
  (memory (export "memory") 1 65536)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (loop $grow
      (br_if $grow (i32.ne (memory.grow (i32.const 1)) (i32.const -1))))
    (i32.store (i32.const 0) (memory.size))
    (call $response_write (i32.const 0) (i32.const 4))
    (i32.const 8)))
