;; badnode: a backend whose node_info always fails (UNAVAILABLE), for the
;; test that one backend's failure leaves NodeGetInfo serving the others.
(module
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))

  (memory (export "memory") 1)
  ;; BackendInfo{Name: "badnode", Version: "1.0.0", Description: "node_info fails", Mount: true}
  (data (i32.const 0) "\0a\07badnode\12\051.0.0\1a\0fnode_info fails0\01")
  (data (i32.const 64) "badnode: node_info fails on purpose")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 35))
    (i32.const 0))

  ;; UNAVAILABLE (14) with a message.
  (func (export "node_info") (result i32)
    (call $response_write (i32.const 64) (i32.const 35))
    (i32.const 14)))
