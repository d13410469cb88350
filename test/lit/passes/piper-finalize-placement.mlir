// piper-finalize-placement: ends the place directives. Every task must be
// placed; a piper.transfer goes on each data edge between device groups, on
// its sender's `send_stream`. (piper-apply-directive places without it;
// piper-place runs it by itself once its last stage is placed.)
// RUN: piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[0]}}' \
// RUN:   '-piper-apply-directive=directive={{"op":"place","filter":{"PP":1},"devices":[1],"stream":"p2p"}}' | FileCheck %s --check-prefix=PLACED
// RUN: piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[0]}}' \
// RUN:   '-piper-apply-directive=directive={{"op":"place","filter":{"PP":1},"devices":[1],"stream":"p2p"}}' -piper-finalize-placement | FileCheck %s
// RUN: piper-opt %S/Inputs/dag.mlir -piper-finalize-placement | FileCheck %s --check-prefix=NONE
// RUN: not piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[0]}}' \
// RUN:   -piper-finalize-placement 2>&1 | FileCheck %s --check-prefix=UNPLACED
// RUN: not piper-opt %S/Inputs/dag.mlir '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[0]}}' \
// RUN:   '-piper-apply-directive=directive={{"op":"place","filter":{"PP":1},"devices":[1]}}' -piper-finalize-placement=world-size=3 2>&1 | FileCheck %s --check-prefix=IDLE

// Placed, not finalized: no transfer yet.
// PLACED-LABEL: piper.program @model
// PLACED-NOT: piper.transfer

// The activation crosses from [0] to [1] on stage 0's stream, right after its
// producer; the gradient crosses back on stage 1's (p2p).
// CHECK-LABEL: piper.program @model
// CHECK: %[[F0:[^:]+]]:3, %{{.*}} = piper.task @stage0_F
// CHECK-NEXT: %[[ACT:[^,]+]], %{{.*}} = piper.transfer %[[F0]]#0 {from = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<1>}
// CHECK-NEXT: piper.task @stage1_F(%[[ACT]], %{{.*}})
// CHECK: %[[B1:[^,]+]], %{{.*}} = piper.task @stage1_B
// CHECK-NEXT: %[[GRAD:[^,]+]], %{{.*}} = piper.transfer %[[B1]] {from = #piper.group<1>, stream = #piper.stream<"p2p", comm>, to = #piper.group<0>}
// CHECK-NEXT: piper.task @stage0_B(%[[GRAD]],
// CHECK-COUNT-2: piper.task @stage{{[01]}}_U
// CHECK-NOT: piper.transfer

// No task placed at all: everything runs on device 0, nothing to transfer.
// NONE-LABEL: piper.program @model
// NONE-COUNT-6: devices = #piper.group<0>, stream = #piper.stream<"compute", compute>
// NONE-NOT: piper.transfer

// UNPLACED: error: 'piper.task' op task @stage1_F (PP=1 PASS=F) is not placed by any place directive
// IDLE: error: 'piper.program' op devices [2] of the 3-device world run no task
