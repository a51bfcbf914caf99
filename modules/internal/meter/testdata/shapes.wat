;; shapes: every kind of function reference and the instructions the meter
;; must step over, for meter_test.go. Each export's answer is the same with
;; and without the loop counter.
(module
  (import "env" "twice" (func $twice (param i64) (result i64)))
  (type $unary (func (param i32) (result i32)))
  (memory (export "memory") 1)
  (table $t 4 funcref)
  (elem (i32.const 0) $inc $dec)
  (elem declare func $square)
  (global $fortytwo i32 (i32.const 42))
  (global $started (mut i32) (i32.const 0))
  (global $fref funcref (ref.func $square))
  (start $init)

  (func $init (global.set $started (i32.const 7)))
  (func $inc (type $unary) (i32.add (local.get 0) (i32.const 1)))
  (func $dec (type $unary) (i32.sub (local.get 0) (i32.const 1)))
  (func $square (type $unary) (i32.mul (local.get 0) (local.get 0)))

  ;; sum of 0..n-1, through the imported function every 1000th step.
  (func (export "sum") (param $n i32) (result i64)
    (local $i i32) (local $acc i64)
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $acc (i64.add (local.get $acc) (i64.extend_i32_u (local.get $i))))
        (if (i32.eqz (i32.rem_u (local.get $i) (i32.const 1000)))
          (then (local.set $acc (i64.sub (call $twice (local.get $acc)) (local.get $acc)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (local.get $acc))

  ;; a loop with a parameter and a result: counts its argument down to 0.
  (func (export "params") (param $n i32) (result i32)
    (local.get $n)
    (loop $l (param i32) (result i32)
      (i32.sub (i32.const 1))
      (local.tee $n)
      (br_if $l (i32.gt_s (local.get $n) (i32.const 0)))))

  ;; nested loops and a br_table choosing among inc, dec and square.
  (func (export "nested") (param $n i32) (result i32)
    (local $i i32) (local $j i32) (local $acc i32)
    (loop $outer
      (local.set $j (i32.const 0))
      (loop $inner
        (block $sq (block $d (block $in
          (br_table $in $d $sq (i32.rem_u (i32.add (local.get $i) (local.get $j)) (i32.const 3))))
          (local.set $acc (call_indirect (type $unary) (local.get $acc) (i32.const 0))) (br 1))
          (local.set $acc (call_indirect (type $unary) (local.get $acc) (i32.const 1))) (br 0))
        (local.set $acc (i32.and (i32.add (local.get $acc) (local.get $j)) (i32.const 0xffff)))
        (local.set $j (i32.add (local.get $j) (i32.const 1)))
        (br_if $inner (i32.lt_u (local.get $j) (local.get $n))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $outer (i32.lt_u (local.get $i) (local.get $n))))
    (local.get $acc))

  ;; memory, bulk memory, SIMD, constants of every width, typed select.
  (func (export "mem") (result i64)
    (memory.fill (i32.const 100) (i32.const 3) (i32.const 16))
    (memory.copy (i32.const 200) (i32.const 100) (i32.const 16))
    (i32.store offset=4 (i32.const 200) (i32.const 0x01020304))
    (v128.store (i32.const 300) (i32x4.add (v128.load (i32.const 200)) (v128.const i32x4 1 2 3 4)))
    (i64.add
      (i64.add (i64.load (i32.const 300)) (i64.const -9223372036854775807))
      (i64.add
        (i64.extend_i32_s (i32x4.extract_lane 3 (v128.load (i32.const 300))))
        (select (result i64)
          (i64.trunc_sat_f64_s (f64.const 1e10))
          (i64.trunc_sat_f32_s (f32.const -2.5))
          (i32.const 1)))))

  ;; the start function's global, a constant global, a funcref global
  ;; called through the table, ref.null and ref.is_null.
  (func (export "refs") (result i32)
    (table.set $t (i32.const 2) (global.get $fref))
    (i32.add
      (i32.add (global.get $started) (global.get $fortytwo))
      (i32.add
        (call_indirect (type $unary) (i32.const 9) (i32.const 2))
        (ref.is_null (ref.null func)))))

  ;; never returns.
  (func (export "forever") (loop $l (br $l))))
