;; ungranted: imports the test_echo host call; its grant lacks the "test" family.
(module
  (import "wasmcsi" "test_echo" (func $test_echo (param i32 i32 i32 i32) (result i64)))
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0)))
