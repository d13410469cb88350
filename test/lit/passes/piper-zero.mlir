// piper-replicate with zero=N: ZeRO over a stage's replicas (docs/zero.md).
// Inputs/dag.mlir split into two microbatches and placed on [0, 1], [2, 3].
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 zero=1 bucket-mb=0.0001" | FileCheck %s --check-prefix=ZERO1
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 zero=2 bucket-mb=0.00005" | FileCheck %s --check-prefix=ZERO2
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 zero=3 bucket-mb=0.0001 gather-stream=gather_stream" | FileCheck %s --check-prefix=ZERO3
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 zero=2 bucket-mb=0.00001" | FileCheck %s --check-prefix=CUTS
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0" -piper-place="pp=1 devices=1" \
// RUN:   -piper-replicate="pp=0 devices=0 zero=1" 2>&1 | FileCheck %s --check-prefix=ONE-DEVICE

// ZeRO-1: the whole accumulators are reduce-scattered once, after both
// backwards (buckets of about 100 bytes); the update runs on each member's
// range and the ranges are gathered back into whole parameters after it.
// ZERO1: [[B0:%.*]] = piper.task @stage0_B({{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>
// ZERO1: [[B1:%.*]] = piper.task @stage0_B({{.*}}tag = #piper.tag<PP = 0, MB = 1, PASS = B>
// ZERO1-NEXT: [[RS0:%.*]] = piper.reduce_scatter_grads [@b1, @w1] after([[B0]], [[B1]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>, zero = 1 : i64}
// ZERO1-NEXT: [[RS1:%.*]] = piper.reduce_scatter_grads [@wte] after([[B0]], [[B1]])
// ZERO1-NEXT: [[U:%.*]] = piper.task @stage0_U() after([[B0]], [[B1]], [[RS0]], [[RS1]])
// ZERO1-NEXT: piper.all_gather_params [@b1, @w1] after([[U]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>, zero = 1 : i64}
// ZERO1-NEXT: piper.all_gather_params [@wte] after([[U]])
// ZERO1-NOT: piper.all_reduce

// ZeRO-2: the backward is cut after the accumulation that fills a bucket
// (b1 and w1, 80 bytes >= 52); each piece returns its gradients instead of
// accumulating them, and they are reduce-scattered per microbatch.
// ZERO2: piper.segment @stage0_B.0({{.*}}) -> (tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>)
// ZERO2-NOT: piper.accumulate_grad @w1
// ZERO2: piper.segment @stage0_B.1(%arg0: tensor<2x2xi32>, %arg1: tensor<4x4xf32>) -> tensor<16x4xf32>
// ZERO2-NOT: piper.accumulate_grad @wte
// ZERO2: [[P0:%.*]]:3, [[D0:%.*]] = piper.task @stage0_B.0({{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>
// ZERO2-NEXT: piper.reduce_scatter_grads [@b1] [[P0]]#1 : tensor<4xf32> after([[D0]]) {{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>, zero = 2 : i64}
// ZERO2-NEXT: piper.reduce_scatter_grads [@w1] [[P0]]#2 : tensor<4x4xf32> after([[D0]])
// ZERO2-NEXT: [[P1:%.*]], [[D1:%.*]] = piper.task @stage0_B.1(%{{.*}}, [[P0]]#0) after([[D0]])
// ZERO2-NEXT: piper.reduce_scatter_grads [@wte] [[P1]] : tensor<16x4xf32> after([[D1]])
// ZERO2: piper.task @stage0_U()
// ZERO2-NEXT: piper.all_gather_params [@b1] after

// Buckets of 10 bytes: every accumulation fills one, but a cut after b1's
// would hand w1's weight gradient (computed before it) to the next piece,
// whose BI half would then read this piece's BW once a zero-bubble order
// splits them (a cycle: issue 20). The cut moves to after w1's
// accumulation; only the input-gradient chain crosses cuts.
// CUTS: piper.segment @stage0_B.0({{.*}}) -> (tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>)
// CUTS-NEXT: piper.gelu_grad
// CUTS: piper.linear_grad_weight
// CUTS-NEXT: piper.bias_grad
// CUTS-NEXT: piper.yield
// CUTS-NEXT: }
// CUTS-NEXT: piper.segment @stage0_B.1(%arg0: tensor<2x2xi32>, %arg1: tensor<4x4xf32>) -> tensor<16x4xf32>
// CUTS-NOT: piper.segment @stage0_B.2

// ZeRO-3: the forward is cut too, before the parameter read that overfills
// a piece; every piece reads gathered parameters as arguments (on
// gather_stream), the update waits for every gather, and nothing gathers
// after it.
// ZERO3: piper.segment @stage0_F.0(%arg0: tensor<2x2xi32>, %arg1: tensor<16x4xf32>) -> tensor<4x4xf32>
// ZERO3-NOT: piper.param_ref @wte
// ZERO3: piper.segment @stage0_F.1(%arg0: tensor<4x4xf32>, %arg1: tensor<4x4xf32>, %arg2: tensor<4xf32>)
// ZERO3: [[G:%.*]], [[GD:%.*]] = piper.all_gather_params [@wte] -> tensor<16x4xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"gather_stream", comm>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>, zero = 3 : i64}
// ZERO3-NEXT: piper.task @stage0_F.0(%{{.*}}, [[G]])
// ZERO3: piper.all_gather_params [@w1, @b1] -> tensor<4x4xf32>, tensor<4xf32>
// ZERO3: piper.all_gather_params [@w1] -> tensor<4x4xf32> {{.*}}PASS = B
// ZERO3: piper.task @stage0_U() after({{.*}}[[GD]]
// ZERO3-NOT: piper.all_gather_params

// ONE-DEVICE: ZeRO-1 shards state over the data-parallel replicas of a stage, but this replicate has one device
