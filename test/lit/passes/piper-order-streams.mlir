// piper-order-streams: fixes the issue order of every device program (a
// recv or batch right before its first consumer, a send or all-reduce right
// after its last producer). Whether the programs then finish a step together
// is decided on their plans by the plan simulator, when the lowering writes
// them (compiler/lowering/lowering_test.cpp has the deadlocks).
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-order-streams | FileCheck %s
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0" -piper-place="pp=1 devices=1" \
// RUN:   -piper-schedule -piper-split-devices -piper-order-streams | FileCheck %s --check-prefix=PIPE

// Class 0 lists its recv first, which would block its pp_stream before the
// send class 1 waits for. Ordered, the send follows its producer and the
// recv moves right before the backward that consumes it; each batch comes
// right before its forward; the all-reduce follows the backward.
// CHECK-LABEL: piper.device_program @class0
// CHECK-NEXT: [[TOK:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<MB = 0>}
// CHECK-NEXT: [[X:%[^,]+]], %{{.*}} = piper.task @f([[TOK]])
// CHECK-NEXT: piper.send [[X]] {channel = 0 : i64
// CHECK-NEXT: [[TOK1:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<MB = 1>}
// CHECK-NEXT: piper.task @f([[TOK1]])
// CHECK-NEXT: [[DX:%[^,]+]], %{{.*}} = piper.recv {channel = 1 : i64
// CHECK-NEXT: [[HD:%.*]] = piper.task @h([[DX]])
// CHECK-NEXT: piper.all_reduce grads [@w] after([[HD]])
// CHECK-NEXT: {{^ *}}}{{$}}
// CHECK-LABEL: piper.device_program @class1
// CHECK-NEXT: [[XM:%[^,]+]], %{{.*}} = piper.recv {channel = 0 : i64
// CHECK-NEXT: [[G:%[^,]+]], %{{.*}} = piper.task @g([[XM]])
// CHECK-NEXT: piper.send [[G]] {channel = 1 : i64
// CHECK-NEXT: {{^ *}}}{{$}}
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @f(%tok: tensor<2x2xi32>) -> tensor<4xf32> {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}
piper.segment @g(%x: tensor<4xf32>) -> tensor<4xf32> {
  piper.yield %x : tensor<4xf32>
}
piper.segment @h(%dx: tensor<4xf32>) {
  piper.accumulate_grad @w, %dx : tensor<4xf32>
  piper.yield
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0, 1>} {
  %dx, %rd = piper.recv {channel = 1 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x2xi32>, tensor<2x2xi32>
  %tok1, %tgt1, %bd1 = piper.batch {tag = #piper.tag<MB = 1>} : tensor<2x2xi32>, tensor<2x2xi32>
  %x, %fd = piper.task @f(%tok) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x2xi32>) -> (tensor<4xf32>, !piper.token)
  %x1, %fd1 = piper.task @f(%tok1) after(%fd) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 1, PASS = F>} : (tensor<2x2xi32>) -> (tensor<4xf32>, !piper.token)
  %hd = piper.task @h(%dx) after(%fd1) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<4xf32>) -> !piper.token
  %s = piper.send %x {channel = 0 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
  %ar = piper.all_reduce grads [@w] after(%hd) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
}
piper.device_program @class1 attributes {device_class = 1 : i64, ranks = array<i64: 2, 3>} {
  %xm, %rd = piper.recv {channel = 0 : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
  %g, %gd = piper.task @g(%xm) {devices = #piper.group<2, 3>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = B>} : (tensor<4xf32>) -> (tensor<4xf32>, !piper.token)
  %s = piper.send %g {channel = 1 : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
}

// -----

// Gradient clipping is world-wide: every device program reaches its clip,
// which follows its last gradient producer, before any update runs.
// CHECK-LABEL: piper.device_program @class0
// CHECK-NEXT: [[B0:%.*]] = piper.task @b() {{.*}}MB = 0, PASS = B
// CHECK-NEXT: [[B1:%.*]] = piper.task @b() after([[B0]]) {{.*}}MB = 1, PASS = B
// CHECK-NEXT: [[AR:%.*]] = piper.all_reduce grads [@w] after([[B0]], [[B1]])
// CHECK-NEXT: [[C:%.*]] = piper.clip_grads after([[B1]], [[AR]]) {max_norm = 1.000000e+00 : f64}
// CHECK-NEXT: piper.task @b() after([[C]]) {{.*}}PASS = U
// CHECK-LABEL: piper.device_program @class1
// CHECK-NEXT: [[B:%.*]] = piper.task @b()
// CHECK-NEXT: [[C:%.*]] = piper.clip_grads after([[B]])
// CHECK-NEXT: piper.task @b() after([[C]])
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @b() {
  piper.yield
}
piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0, 1>} {
  %b0 = piper.task @b() {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : () -> !piper.token
  %b1 = piper.task @b() after(%b0) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 1, PASS = B>} : () -> !piper.token
  %ar = piper.all_reduce grads [@w] after(%b0, %b1) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
  %c = piper.clip_grads after(%b1, %ar) {max_norm = 1.0 : f64}
  %u = piper.task @b() after(%c) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
}
piper.device_program @class1 attributes {device_class = 1 : i64, ranks = array<i64: 2>} {
  %b = piper.task @b() {devices = #piper.group<2>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = B>} : () -> !piper.token
  %c = piper.clip_grads after(%b) {max_norm = 1.0 : f64}
  %u = piper.task @b() after(%c) {devices = #piper.group<2>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
}

// -----

// The pass runs after piper-split-devices.
// expected-error @+1 {{no device programs: run piper-split-devices first}}
module {
  piper.program @p {
  }
}

// The whole pipeline with a 1F1B schedule over two stages: stage 1's recv
// of microbatch 1 waits until its backward of microbatch 0 is issued, and
// each recv is issued right before the task that reads it.
// PIPE-LABEL: piper.device_program @class0
// PIPE: [[R0:%[^,]+]], %{{.*}} = piper.recv {channel = [[G0:[0-9]+]] : i64, peers = #piper.group<1>
// PIPE-NEXT: piper.task @stage0_B([[R0]], {{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>
// PIPE-NEXT: [[R1:%[^,]+]], %{{.*}} = piper.recv {channel = [[G1:[0-9]+]] : i64, peers = #piper.group<1>
// PIPE-NEXT: piper.task @stage0_B([[R1]], {{.*}}tag = #piper.tag<PP = 0, MB = 1, PASS = B>
// PIPE-LABEL: piper.device_program @class1
// PIPE: [[A0:%[^,]+]], %{{.*}} = piper.recv {channel = {{[0-9]+}} : i64, peers = #piper.group<0>
// PIPE-NEXT: piper.task @stage1_F([[A0]], {{.*}}tag = #piper.tag<PP = 1, MB = 0, PASS = F>
// PIPE-NEXT: [[GR0:%[^,]+]], %{{.*}} = piper.task @stage1_B({{.*}}tag = #piper.tag<PP = 1, MB = 0, PASS = B>
// PIPE-NEXT: piper.send [[GR0]] {channel = [[G0]] : i64
// PIPE: [[A1:%[^,]+]], %{{.*}} = piper.recv {channel = {{[0-9]+}} : i64, peers = #piper.group<0>
// PIPE-NEXT: piper.task @stage1_F([[A1]], {{.*}}tag = #piper.tag<PP = 1, MB = 1, PASS = F>
// PIPE-NEXT: [[GR1:%[^,]+]], %{{.*}} = piper.task @stage1_B({{.*}}tag = #piper.tag<PP = 1, MB = 1, PASS = B>
// PIPE-NEXT: piper.send [[GR1]] {channel = [[G1]] : i64
