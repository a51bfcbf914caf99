;; tables: two tables, the first without a maximum (as standard Go declares
;; its table), the second with one. grow(n) grows the first by n entries
;; and answers its old size, or -1 when it cannot grow; grow2 the same for
;; the second; size and size2 answer their sizes. flood grows the first
;; table one entry at a time until table.grow fails, and answers its size.
(module
  (table $a 3 funcref)
  (table $b 2 10 externref)
  (func (export "grow") (param $n i32) (result i32)
    (table.grow $a (ref.null func) (local.get $n)))
  (func (export "grow2") (param $n i32) (result i32)
    (table.grow $b (ref.null extern) (local.get $n)))
  (func (export "size") (result i32) (table.size $a))
  (func (export "size2") (result i32) (table.size $b))
  (func (export "flood") (result i32)
    (block $full
      (loop $l
        (br_if $full (i32.eq (table.grow $a (ref.null func) (i32.const 1)) (i32.const -1)))
        (br $l)))
    (table.size $a)))
