// piper-order: the order directives of a file, alone. Stage 0's forward of
// microbatch 1 is ordered before that of microbatch 0: the MB 0 task waits on
// the MB 1 task's token and the block is re-sorted to follow.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-order=file=%S/Inputs/order-reverse.json | FileCheck %s
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-order=file=%S/Inputs/order-not-order.json 2>&1 | FileCheck %s --check-prefix=NOTORDER
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-order=file=%S/Inputs/missing.json 2>&1 | FileCheck %s --check-prefix=MISSING
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-order=file=%S/Inputs/order-backward-first.json 2>&1 | FileCheck %s --check-prefix=CYCLE

// CHECK: [[F1:%[^ ]+]] = piper.task @stage0_F(%{{[^)]*}}) {tag = #piper.tag<PP = 0, MB = 1, PASS = F>}
// CHECK: piper.task @stage0_F(%{{[^)]*}}) after([[F1]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>}

// NOTORDER: error: directive #0 ({{.*}}"op":"split"}): piper-order applies order directives only (use piper-apply-strategy for a whole strategy)

// MISSING: error: order file '{{.*}}missing.json': cannot open: no such file or directory

// CYCLE: error: 'piper.program' op directive #0 ({{.*}}): the order contradicts the dataflow and creates a cycle: task @stage1_F (PP=1 MB=0 PASS=F) -> task @stage1_B
