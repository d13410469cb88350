// piper-split: the training DAG copied per microbatch (MB tag); the update
// tasks stay single and wait for every copy of their stage's backward.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 | FileCheck %s
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split | FileCheck %s --check-prefix=ONE
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=0 2>&1 | FileCheck %s --check-prefix=ZERO
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-split=microbatches=2 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-split=microbatches=2

// Two microbatches, in the default GPipe order: each microbatch's batch and
// forwards, then each microbatch's backwards, then the updates. Every copy
// reads its own microbatch's values.
// CHECK-LABEL: piper.program @model attributes {num_microbatches = 2 : i64} {
// CHECK-NEXT: [[TOK0:%[^,]+]], [[TGT0:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<MB = 0>}
// CHECK-NEXT: [[F00:%[^:]+]]:3, %{{.*}} = piper.task @stage0_F([[TOK0]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>}
// CHECK-NEXT: [[F10:%[^,]+]], %{{.*}} = piper.task @stage1_F([[F00]]#0, [[TGT0]]) {tag = #piper.tag<PP = 1, MB = 0, PASS = F>}
// CHECK-NEXT: [[TOK1:%[^,]+]], [[TGT1:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<MB = 1>}
// CHECK-NEXT: [[F01:%[^:]+]]:3, %{{.*}} = piper.task @stage0_F([[TOK1]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = F>}
// CHECK-NEXT: [[F11:%[^,]+]], %{{.*}} = piper.task @stage1_F([[F01]]#0, [[TGT1]]) {tag = #piper.tag<PP = 1, MB = 1, PASS = F>}
// CHECK-NEXT: [[B10:%[^,]+]], [[B10D:%[^ ]+]] = piper.task @stage1_B([[TGT0]], [[F10]], [[F00]]#0) {tag = #piper.tag<PP = 1, MB = 0, PASS = B>}
// CHECK-NEXT: [[B00D:%.*]] = piper.task @stage0_B([[B10]], [[F00]]#1, [[F00]]#2, [[TOK0]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = B>}
// CHECK-NEXT: [[B11:%[^,]+]], [[B11D:%[^ ]+]] = piper.task @stage1_B([[TGT1]], [[F11]], [[F01]]#0) {tag = #piper.tag<PP = 1, MB = 1, PASS = B>}
// CHECK-NEXT: [[B01D:%.*]] = piper.task @stage0_B([[B11]], [[F01]]#1, [[F01]]#2, [[TOK1]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = B>}
// CHECK-NEXT: piper.task @stage0_U() after([[B00D]], [[B01D]]) {tag = #piper.tag<PP = 0, PASS = U>}
// CHECK-NEXT: piper.task @stage1_U() after([[B10D]], [[B11D]]) {tag = #piper.tag<PP = 1, PASS = U>}
// CHECK-NEXT: {{^ *}}}{{$}}

// One microbatch still tags every batch, forward and backward with MB = 0.
// ONE-LABEL: piper.program @model {
// ONE-NEXT: piper.batch {tag = #piper.tag<MB = 0>}
// ONE-NEXT: piper.task @stage0_F({{.*}}) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>}
// ONE-NEXT: piper.task @stage1_F({{.*}}) {tag = #piper.tag<PP = 1, MB = 0, PASS = F>}
// ONE-NEXT: piper.task @stage1_B({{.*}}) {tag = #piper.tag<PP = 1, MB = 0, PASS = B>}
// ONE-NEXT: piper.task @stage0_B({{.*}}) {tag = #piper.tag<PP = 0, MB = 0, PASS = B>}
// ONE-NEXT: piper.task @stage0_U() after(%{{.*}}) {tag = #piper.tag<PP = 0, PASS = U>}
// ONE-NEXT: piper.task @stage1_U() after(%{{.*}}) {tag = #piper.tag<PP = 1, PASS = U>}

// The option must be positive.
// ZERO: error: directive #0 (piper-split microbatches=0): "num_microbatches" must be positive

// Splitting twice is an error naming the directive.
// TWICE: error: 'piper.program' op directive #0 (piper-split microbatches=2): the program is already split

// A program that records microbatches is already split.
piper.segment @s() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op directive #0 (piper-split microbatches=2): the program is already split}}
piper.program @p attributes {num_microbatches = 4 : i64} {
  %d = piper.task @s() {tag = #piper.tag<PP = 0, PASS = F>} : () -> !piper.token
}

// -----

// So is a program whose tasks carry an MB tag (a split into one microbatch).
piper.segment @s() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op directive #0 (piper-split microbatches=2): the program is already split}}
piper.program @p {
  %d = piper.task @s() {tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> !piper.token
}

// -----

// Split comes before place: no transfers yet.
piper.segment @f() -> tensor<4xf32> {
  %x = piper.param_ref @w : tensor<4xf32>
  piper.yield %x : tensor<4xf32>
}
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  %x, %d = piper.task @f() {devices = #piper.group<0>, tag = #piper.tag<PP = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  // expected-error @+1 {{'piper.transfer' op directive #0 (piper-split microbatches=2): split must come before place and replicate}}
  %y, %t = piper.transfer %x {from = #piper.group<0>, to = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
}

// -----

// Split comes before replicate: no all-reduces yet.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op directive #0 (piper-split microbatches=2): split must come before place and replicate}}
  %a = piper.all_reduce grads [@w] {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
}
