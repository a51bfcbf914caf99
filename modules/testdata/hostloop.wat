;; hostloop: create_volume passes its request to the test_echo host call,
;; then never returns.
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "test_echo" (func $test_echo (param i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (result i32)
    (drop (call $test_echo
      (i32.const 1024) (call $request_read (i32.const 1024) (i32.const 1024))
      (i32.const 0) (i32.const 0)))
    (loop $forever (br $forever))
    (i32.const 0)))
