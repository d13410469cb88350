// piper-apply-directive: one directive of any kind, given as its JSON object
// (wrapped in one more pair of braces: MLIR's option parser strips one). The
// directive pipeline runs one per directive of a strategy.
// RUN: piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"split","num_microbatches":2}}' -o %t.directive.mlir
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -o %t.pass.mlir
// RUN: diff %t.directive.mlir %t.pass.mlir
// RUN: piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[0, 1]}}' | FileCheck %s
// RUN: not piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[4]}} world-size=2' 2>&1 | FileCheck %s --check-prefix=WORLD
// RUN: not piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"fuse"}}' 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive=[1' 2>&1 | FileCheck %s --check-prefix=JSON
// RUN: not piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"split","num_microbatches":2},{"op":"split","num_microbatches":3}}' 2>&1 | FileCheck %s --check-prefix=TWO

// CHECK: piper.task @stage0_F({{.*}}devices = #piper.group<0, 1>
// CHECK: piper.task @stage1_F({{.*}}) {tag = #piper.tag<PP = 1, PASS = F>}

// WORLD: error: {{.*}}directive #0 ({"devices":[4],"filter":{"PP":0},"op":"place"}){{.*}}4
// UNKNOWN: error: piper-apply-directive: {{.*}}fuse
// JSON: error: piper-apply-directive: {{.*}}JSON
// TWO: error: piper-apply-directive: expected one directive, got 2
