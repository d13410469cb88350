// piper-recompute, the recompute directive's pass (on the forward model,
// before piper-stage), marks a block's forward ops; piper-build-training-dag
// keeps only the block's input for the backward and re-runs the marked ops
// there, where the first gradient rule reads them, from re-read parameters.
// The JSON directive (piper-apply-directive) does the same (the diff).
// RUN: piper-opt %S/Inputs/model.mlir -piper-recompute=block=1 | FileCheck %s --check-prefix=MARK
// RUN: piper-opt %S/Inputs/model.mlir -piper-recompute=block=1 > %t.pass.mlir
// RUN: piper-opt %S/Inputs/model.mlir '-piper-apply-directive=directive={{"op":"recompute","filter":{"block":1}}}' | diff - %t.pass.mlir
// RUN: piper-opt %S/Inputs/model.mlir -piper-recompute=block=1 -piper-stage -piper-build-training-dag | FileCheck %s
// RUN: not piper-opt %S/Inputs/model.mlir -piper-recompute 2>&1 | FileCheck %s --check-prefix=NONE
// RUN: not piper-opt %S/Inputs/model.mlir '-piper-apply-directive=directive={{"op":"recompute"}}' 2>&1 | FileCheck %s --check-prefix=NONE-JSON
// RUN: not piper-opt %S/Inputs/model.mlir "-piper-recompute=granularity=selective block=1" 2>&1 | FileCheck %s --check-prefix=SELECTIVE
// RUN: not piper-opt %S/Inputs/model.mlir -piper-recompute=granularity=some 2>&1 | FileCheck %s --check-prefix=BAD

// MARK-LABEL: piper.segment @embed(
// MARK-NOT: piper.recompute
// MARK-LABEL: piper.segment @block0(
// MARK: piper.param_ref @w1 : tensor<4x4xf32>
// MARK: piper.linear {{.*}} {piper.recompute = 1 : i64}
// MARK: piper.gelu {{.*}} {piper.recompute = 1 : i64}
// MARK-LABEL: piper.segment @head(
// MARK-NOT: piper.recompute

// Without it the forward would return the logits' gradient (the fused
// classifier), the embedding, the linear's output and the GELU's; with it,
// the logits' gradient and the block's input.
// CHECK-LABEL: piper.segment @stage0_F(%arg0: tensor<2x2xi32>, %arg1: tensor<2x2xi32>) -> (tensor<4x16xf32>, tensor<4x4xf32>)
// CHECK: [[X:%[0-9]+]] = piper.embedding
// CHECK-NOT: piper.recompute
// CHECK: %{{[a-z]+}}, [[DL:%[a-z]+]] = piper.cross_entropy_fused
// CHECK: piper.yield [[DL]], [[X]] : tensor<4x16xf32>, tensor<4x4xf32>
// CHECK-LABEL: piper.segment @stage0_B(%arg0: tensor<4x16xf32>, %arg1: tensor<4x4xf32>, %arg2: tensor<2x2xi32>)
// CHECK: piper.linear_grad_input %arg0
// CHECK: [[W:%[0-9]+]] = piper.param_ref @w1
// CHECK: [[B:%[0-9]+]] = piper.param_ref @b1
// CHECK: [[Y:%[0-9]+]] = piper.linear %arg1, [[W]], [[B]]
// CHECK-NEXT: [[G:%[0-9]+]] = piper.gelu [[Y]]
// CHECK-NEXT: piper.linear_grad_weight [[G]],
// CHECK: piper.gelu_grad [[Y]],
// CHECK: piper.linear_grad_weight_bias %arg1,
// CHECK-NOT: piper.recompute
// CHECK: piper.yield

// A model without attention has no transformer block for the default
// filter.
// NONE: error: 'piper.program' op directive #0 (piper-recompute granularity=full): the model has no transformer block (a block with attention) to recompute
// NONE-JSON: error: 'piper.program' op directive #0 ({"op":"recompute"}): the model has no transformer block (a block with attention) to recompute
// SELECTIVE: error: {{.*}}directive #0 (piper-recompute granularity=selective block=1): {{.*}}attention
// BAD: for the --granularity option: Cannot find option named 'some'!
