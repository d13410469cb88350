// piper-split-devices: one piper.device_program per device class (distinct
// device group); each transfer becomes a send in the sender's class and a
// recv in the receiver's, paired by a channel number.
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-split-devices | FileCheck %s
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1" -piper-replicate="pp=1 devices=2,3" -piper-split-devices | FileCheck %s --check-prefix=PIPE

// Two classes. The batch is loaded by both (each reads a part of it); the
// activation goes 0 -> 1 on channel 0 and its gradient 1 -> 0 on channel 1.
// Token edges from the other class are dropped; those within a class stay.
// CHECK-LABEL: module {
// CHECK-NOT: piper.program
// CHECK-LABEL: piper.device_program @class0 attributes {device_class = 0 : i64, num_replicas = 2 : i64, ranks = array<i64: 0, 1>} {
// CHECK-NEXT: [[TOK:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<MB = 0>}
// CHECK-NEXT: [[X:%[^,]+]], [[FD:%[^ ]+]] = piper.task @f([[TOK]]) {devices = #piper.group<0, 1>
// CHECK-NEXT: piper.send [[X]] {channel = 0 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
// CHECK-NEXT: [[DX:%[^,]+]], %{{.*}} = piper.recv {channel = 1 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"grad_stream", comm>} : tensor<4xf32>
// CHECK-NEXT: [[HD:%.*]] = piper.task @h([[DX]]) after([[FD]]) {devices = #piper.group<0, 1>
// CHECK-NEXT: [[AR:%.*]] = piper.all_reduce grads [@w] after([[HD]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// CHECK-NEXT: piper.task @u() after([[HD]], [[AR]]) {devices = #piper.group<0, 1>
// CHECK-NEXT: {{^ *}}}{{$}}
// CHECK-LABEL: piper.device_program @class1 attributes {device_class = 1 : i64, num_replicas = 2 : i64, ranks = array<i64: 2, 3>} {
// CHECK-NEXT: %{{.*}}, [[TGT:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<MB = 0>}
// CHECK-NEXT: [[XM:%[^,]+]], %{{.*}} = piper.recv {channel = 0 : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
// CHECK-NEXT: [[G:%[^,]+]], %{{.*}} = piper.task @g([[XM]], [[TGT]]) {devices = #piper.group<2, 3>
// CHECK-NEXT: piper.send [[G]] {channel = 1 : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"grad_stream", comm>} : tensor<4xf32>
// CHECK-NEXT: {{^ *}}}{{$}}
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @f(%tok: tensor<2x2xi32>) -> tensor<4xf32> {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}
piper.segment @g(%x: tensor<4xf32>, %tgt: tensor<2x2xi32>) -> tensor<4xf32> {
  piper.yield %x : tensor<4xf32>
}
piper.segment @h(%dx: tensor<4xf32>) {
  piper.accumulate_grad @w, %dx : tensor<4xf32>
  piper.yield
}
piper.segment @u() {
  piper.zero_grad @w
  piper.yield
}
piper.program @p attributes {num_replicas = 2 : i64} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x2xi32>, tensor<2x2xi32>
  %x, %fd = piper.task @f(%tok) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x2xi32>) -> (tensor<4xf32>, !piper.token)
  %xm, %td = piper.transfer %x {from = #piper.group<0, 1>, to = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4xf32>
  %dx, %gd = piper.task @g(%xm, %tgt) {devices = #piper.group<2, 3>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = B>} : (tensor<4xf32>, tensor<2x2xi32>) -> (tensor<4xf32>, !piper.token)
  %dxm, %td2 = piper.transfer %dx {from = #piper.group<2, 3>, to = #piper.group<0, 1>, stream = #piper.stream<"grad_stream", comm>} : tensor<4xf32>
  %hd = piper.task @h(%dxm) after(%fd) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<4xf32>) -> !piper.token
  %ar = piper.all_reduce grads [@w] after(%hd) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
  %ud = piper.task @u() after(%hd, %ar, %gd) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
}

// -----

// Classes are numbered by their first rank, not by first appearance.
// CHECK-LABEL: piper.device_program @class0 attributes {{{.*}}ranks = array<i64: 1>} {
// CHECK-NEXT: piper.task @f() {devices = #piper.group<1>, tag = #piper.tag<PP = 1>}
// CHECK-LABEL: piper.device_program @class1 attributes {{{.*}}ranks = array<i64: 3>} {
// CHECK-NEXT: piper.task @f() {devices = #piper.group<3>, tag = #piper.tag<PP = 0>}
piper.segment @f() {
  piper.yield
}
piper.program @p {
  %d0 = piper.task @f() {devices = #piper.group<3>, tag = #piper.tag<PP = 0>} : () -> !piper.token
  %d1 = piper.task @f() {devices = #piper.group<1>, tag = #piper.tag<PP = 1>} : () -> !piper.token
}

// -----

// Every task must be placed.
piper.segment @f() {
  piper.yield
}
piper.program @p {
  %d0 = piper.task @f() {devices = #piper.group<0>, tag = #piper.tag<PP = 0, PASS = F>} : () -> !piper.token
  // expected-error @+1 {{'piper.task' op task @f (PP=1 PASS=F) is not placed; run the place directives first}}
  %d1 = piper.task @f() {tag = #piper.tag<PP = 1, PASS = F>} : () -> !piper.token
}

// -----

// Device groups must not overlap: a device belongs to one class.
piper.segment @f() {
  piper.yield
}
piper.program @p {
  %d0 = piper.task @f() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0>} : () -> !piper.token
  // expected-error @+1 {{'piper.task' op device 1 belongs to two different device groups; every device must belong to exactly one group}}
  %d1 = piper.task @f() {devices = #piper.group<1, 2>, tag = #piper.tag<PP = 1>} : () -> !piper.token
}

// -----

// With gradient clipping on (optimizer, from build-training-dag), each
// device program gets one world-wide clip after its backwards and
// all-reduces and before its updates; the optimizer settings are copied.
// CHECK-LABEL: piper.device_program @class0 attributes {device_class = 0 : i64, num_replicas = 2 : i64, optimizer = #piper.optimizer<clip_grad_norm = 5.000000e-01>, ranks = array<i64: 0, 1>} {
// CHECK-NEXT: [[B:%.*]] = piper.task @bwd() {devices = #piper.group<0, 1>
// CHECK-NEXT: [[AR:%.*]] = piper.all_reduce grads [@w] after([[B]])
// CHECK-NEXT: [[CLIP:%.*]] = piper.clip_grads after([[B]], [[AR]]) {max_norm = 5.000000e-01 : f64}
// CHECK-NEXT: piper.task @upd() after([[B]], [[AR]], [[CLIP]]) {devices = #piper.group<0, 1>
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @bwd() {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.accumulate_grad @w, %w : tensor<4xf32>
  piper.yield
}
piper.segment @upd() {
  piper.zero_grad @w
  piper.yield
}
piper.program @p attributes {num_replicas = 2 : i64, optimizer = #piper.optimizer<clip_grad_norm = 0.5>} {
  %b = piper.task @bwd() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = B>} : () -> !piper.token
  %ar = piper.all_reduce grads [@w] after(%b) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
  %u = piper.task @upd() after(%b, %ar) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
}

// -----

// Replicas that accumulate a gradient must all-reduce it, or they diverge.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @bwd() {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.accumulate_grad @w, %w : tensor<4xf32>
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op task @bwd (PP=0 PASS=B) runs on 2 devices but the gradient of @w is never all-reduced; add a replicate directive for its stage}}
  %b = piper.task @bwd() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = B>} : () -> !piper.token
}

// -----

// A hand-written data edge between device groups needs a transfer.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @p0() -> tensor<4xf32> {
  %x = piper.param_ref @w : tensor<4xf32>
  piper.yield %x : tensor<4xf32>
}
piper.segment @c0(%x: tensor<4xf32>) {
  piper.yield
}
piper.program @p {
  %x, %d0 = piper.task @p0() {devices = #piper.group<0>, tag = #piper.tag<PP = 0>} : () -> (tensor<4xf32>, !piper.token)
  // expected-error @+1 {{'piper.task' op runs on [1] but reads a value of task @p0 (PP=0) on [0] without a transfer; run the place directives}}
  %d1 = piper.task @c0(%x) {devices = #piper.group<1>, tag = #piper.tag<PP = 1>} : (tensor<4xf32>) -> !piper.token
}

// -----

// A transfer must start from the group that produced its value.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @p0() -> tensor<4xf32> {
  %x = piper.param_ref @w : tensor<4xf32>
  piper.yield %x : tensor<4xf32>
}
piper.segment @c0(%x: tensor<4xf32>) {
  piper.yield
}
piper.program @p {
  %x, %d0 = piper.task @p0() {devices = #piper.group<0>, tag = #piper.tag<PP = 0>} : () -> (tensor<4xf32>, !piper.token)
  // expected-error @+1 {{'piper.transfer' op sends from [1] a value produced on [0]}}
  %y, %t = piper.transfer %x {from = #piper.group<1>, to = #piper.group<2>, stream = #piper.stream<"pp", comm>} : tensor<4xf32>
  %d1 = piper.task @c0(%y) {devices = #piper.group<1>, tag = #piper.tag<PP = 1>} : (tensor<4xf32>) -> !piper.token
  %d2 = piper.task @c0(%y) {devices = #piper.group<2>, tag = #piper.tag<PP = 2>} : (tensor<4xf32>) -> !piper.token
}

// -----

// There must be a program to split.
// expected-error @+1 {{module has no piper.program}}
module {
}

// The full pipeline, two stages on [0, 1] and [2, 3], two microbatches:
// every send has the recv of its channel in the other class.
// PIPE-LABEL: piper.device_program @class0 attributes {device_class = 0 : i64, num_microbatches = 2 : i64, num_replicas = 2 : i64, ranks = array<i64: 0, 1>} {
// PIPE: piper.send %{{.*}} {channel = [[A0:[0-9]+]] : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.send %{{.*}} {channel = [[A1:[0-9]+]] : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.recv {channel = [[G0:[0-9]+]] : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.recv {channel = [[G1:[0-9]+]] : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.all_reduce grads [@b1, @w1, @wte] {{.*}}devices = #piper.group<0, 1>
// PIPE-NOT: piper.send %
// PIPE-NOT: piper.recv {
// PIPE-LABEL: piper.device_program @class1 attributes {device_class = 1 : i64, num_microbatches = 2 : i64, num_replicas = 2 : i64, ranks = array<i64: 2, 3>} {
// PIPE: piper.recv {channel = [[A0]] : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.recv {channel = [[A1]] : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.send %{{.*}} {channel = [[G0]] : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE: piper.all_reduce grads [@lm] {{.*}}devices = #piper.group<2, 3>
// PIPE: piper.send %{{.*}} {channel = [[G1]] : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// PIPE-NOT: piper.send %
// PIPE-NOT: piper.recv {
