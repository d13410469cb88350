// piper-split-backward: a fused backward task becomes BI (the
// activation-gradient chain) then BW (weight gradients and accumulations),
// as an order directive naming PASS "BI" does before it orders them.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-split-backward="pp=0 mb=1" | FileCheck %s
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split-backward | FileCheck %s --check-prefix=ALL

// Only stage 0's microbatch 1 is split; the fused segment stays for MB 0.
// CHECK: piper.segment @stage0_B(
// CHECK: piper.segment @stage0_BI({{.*}}) -> (tensor<4x4xf32>, tensor<4x4xf32>) attributes {piper.pass = #piper.pass<BI>}
// CHECK: piper.segment @stage0_BW({{.*}}) attributes {piper.pass = #piper.pass<BW>}
// CHECK: piper.task @stage0_B({{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>
// CHECK: piper.task @stage1_B({{.*}}tag = #piper.tag<PP = 1, MB = 1, PASS = B>
// CHECK-NEXT: %[[BI:[^:]+]]:2, %[[BIDONE:[^ ]+]] = piper.task @stage0_BI({{.*}}tag = #piper.tag<PP = 0, MB = 1, PASS = BI>
// CHECK-NEXT: %[[BWDONE:[^ ]+]] = piper.task @stage0_BW(%{{.*}}, %[[BI]]#0, %{{.*}}, %[[BI]]#1) after(%[[BIDONE]]) {{.*}}tag = #piper.tag<PP = 0, MB = 1, PASS = BW>
// The update waits for the weight gradients.
// CHECK-NEXT: piper.task @stage0_U() after(%{{.*}}, %[[BWDONE]])

// Every backward task split; no fused segment is left.
// ALL-NOT: piper.segment @stage{{[01]}}_B(
// ALL: piper.segment @stage0_BI
// ALL: piper.segment @stage0_BW
// ALL: piper.segment @stage1_BI
// ALL: piper.segment @stage1_BW
// ALL-NOT: PASS = B>
