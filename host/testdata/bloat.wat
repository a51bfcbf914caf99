;; bloat: a backend whose answers break CSI's size and topology rules, for
;; the tests of what the host checks in a module's answers.
;;   create_volume  by the name's first letter: "o" answers the volume "ok";
;;       "t" the volume "bt" with the topology {"example.com/zone": "-bad-"}
;;       (a value must begin with an alphanumeric); anything else the volume
;;       "bv" with a volume context {"k": 4100 times "a"}, over CSI's 4 KiB
;;   create_snapshot     the snapshot "bs" with that context
;;   controller_publish  that context as the publish context
;;   expand_volume       1 GiB with that context
;;   node_info           the topology above
;;   delete_volume, controller_unpublish  succeed
(module
  (import "wasmcsi" "request_read" (func $request_read (param i32 i32) (result i32)))
  (import "wasmcsi" "response_write" (func $response_write (param i32 i32)))

  ;; [0, 1024) constants, [1024, 5120) request, [8194, 12309) big answers
  (memory (export "memory") 1)
  ;; BackendInfo{Name: "bloat", Version: "1.0.0", Description: "oversized answers", Mount: true}
  (data (i32.const 0) "\0a\05bloat\12\051.0.0\1a\11oversized answers0\01")
  ;; CreateVolumeResponse{LocalID: "ok"}
  (data (i32.const 64) "\0a\02ok")
  ;; CreateVolumeResponse{LocalID: "bt", Topology: [{"example.com/zone": "-bad-"}]}
  (data (i32.const 96) "\0a\02bt\22\1b\0a\19\0a\10example.com/zone\12\05-bad-")
  ;; NodeInfoResponse{Topology: {"example.com/zone": "-bad-"}}
  (data (i32.const 160) "\0a\1b\0a\19\0a\10example.com/zone\12\05-bad-")
  ;; a map entry {"k": 4100 bytes}, its tag (at 8200) set by each answer
  (data (i32.const 8201) "\8a\20\0a\01k\12\84\20")

  (func (export "wasmcsi_abi_version") (result i32) (i32.const 1))

  (func (export "backend_info") (result i32)
    (call $response_write (i32.const 0) (i32.const 35))
    (i32.const 0))

  (func (export "create_volume") (result i32)
    (local $first i32)
    (drop (call $request_read (i32.const 1024) (i32.const 4096)))
    (local.set $first (i32.load8_u (i32.const 1026)))
    (if (i32.eq (local.get $first) (i32.const 0x6f)) ;; "o"
      (then (call $response_write (i32.const 64) (i32.const 4)) (return (i32.const 0))))
    (if (i32.eq (local.get $first) (i32.const 0x74)) ;; "t"
      (then (call $response_write (i32.const 96) (i32.const 33)) (return (i32.const 0))))
    ;; LocalID "bv", then the context as field 3
    (i32.store (i32.const 8196) (i32.const 0x7662020a))
    (call $big (i32.const 0x1a) (i32.const 8196) (i32.const 4)))

  (func (export "create_snapshot") (result i32)
    ;; LocalID "bs", then the context as field 3
    (i32.store (i32.const 8196) (i32.const 0x7362020a))
    (call $big (i32.const 0x1a) (i32.const 8196) (i32.const 4)))

  (func (export "controller_publish") (result i32)
    (call $big (i32.const 0x0a) (i32.const 8200) (i32.const 0)))

  (func (export "expand_volume") (result i32)
    ;; CapacityBytes (field 1) 1 GiB, then the context as field 3
    (i32.store8 (i32.const 8194) (i32.const 0x08))
    (i32.store (i32.const 8195) (i32.const 0x80808080))
    (i32.store8 (i32.const 8199) (i32.const 0x04))
    (call $big (i32.const 0x1a) (i32.const 8194) (i32.const 6)))

  (func (export "node_info") (result i32)
    (call $response_write (i32.const 160) (i32.const 29))
    (i32.const 0))

  (func (export "delete_volume") (result i32) (i32.const 0))
  (func (export "controller_unpublish") (result i32) (i32.const 0))

  ;; $big answers the bytes from $at: $before bytes of other fields, then
  ;; the context entry under tag $tag.
  (func $big (param $tag i32) (param $at i32) (param $before i32) (result i32)
    (i32.store8 (i32.const 8200) (local.get $tag))
    (memory.fill (i32.const 8209) (i32.const 0x61) (i32.const 4100))
    (call $response_write (local.get $at) (i32.add (local.get $before) (i32.const 4109)))
    (i32.const 0)))
