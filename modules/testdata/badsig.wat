;; badsig: create_volume takes a parameter; operations take none.
(module
  (memory (export "memory") 1)
  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))
  (func (export "backend_info") (result i32) (i32.const 0))
  (func (export "create_volume") (param i32) (result i32) (local.get 0)))
