;; bulk: loops around work the countdown does not see.
;;   fill(n, len)   fills len bytes at 0, n times
;;   imported(n)    calls the imported env.twice n times
(module
  (import "env" "twice" (func $twice (param i64) (result i64)))
  (memory 128)
  (func (export "fill") (param $n i32) (param $len i32) (result i32)
    (local $i i32)
    (loop $l
      (memory.fill (i32.const 0) (i32.const 7) (local.get $len))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $i))
  (func (export "imported") (param $n i32) (result i64)
    (local $i i32) (local $acc i64)
    (local.set $acc (i64.const 1))
    (loop $l
      (local.set $acc (call $twice (local.get $acc)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $acc)))
