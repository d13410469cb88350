// piper-tie-params: a parameter whose gradient is accumulated on several
// device groups (a tied head) is summed over all of them at once.
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-tie-params | FileCheck %s
// RUN: not piper-opt %s -split-input-file -piper-tie-params=bucket-mb=0 2>&1 | FileCheck %s --check-prefix=BUCKET
// BUCKET: error: piper-tie-params: bucket-mb must be positive, got 0

// The embedding's stage on [0] and the head's stage on [1] both accumulate
// @wte: one all-reduce over [0, 1] after both backwards, before both updates.
// CHECK-LABEL: piper.program @p
// CHECK: [[B0:%[^ ]+]] = piper.task @bwd0(
// CHECK: [[B1:%[^ ]+]] = piper.task @bwd1(
// CHECK: [[AR:%[^ ]+]] = piper.all_reduce grads [@wte] after([[B0]], [[B1]]) {collective = 0 : i64, devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
// CHECK: piper.task @upd() after([[B0]], [[AR]]) {devices = #piper.group<0>
// CHECK: piper.task @upd() after([[B1]], [[AR]]) {devices = #piper.group<1>
piper.param @wte : tensor<4xf32> init zeros(0.0)
piper.segment @bwd0(%g: tensor<4xf32>) {
  piper.accumulate_grad @wte, %g : tensor<4xf32>
  piper.yield
}
piper.segment @bwd1(%g: tensor<4xf32>) {
  piper.accumulate_grad @wte, %g : tensor<4xf32>
  piper.yield
}
piper.segment @upd() {
  piper.adamw @wte {beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, lr = 1.0e-3 : f64, weight_decay = 0.0 : f64}
  piper.zero_grad @wte
  piper.yield
}
piper.segment @src() -> tensor<4xf32> {
  %w = piper.param_ref @wte : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}
piper.program @p {
  %g0, %s0 = piper.task @src() {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %g1, %s1 = piper.task @src() {devices = #piper.group<1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %b0 = piper.task @bwd0(%g0) {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = B>} : (tensor<4xf32>) -> !piper.token
  %b1 = piper.task @bwd1(%g1) {devices = #piper.group<1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, PASS = B>} : (tensor<4xf32>) -> !piper.token
  %u0 = piper.task @upd() after(%b0) {devices = #piper.group<0>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
  %u1 = piper.task @upd() after(%b1) {devices = #piper.group<1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
}

// -----

// Groups holding copies must be disjoint: each copy's gradient counts once.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @src() -> tensor<4xf32> {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}
piper.segment @bwd(%g: tensor<4xf32>) {
  piper.accumulate_grad @w, %g : tensor<4xf32>
  piper.yield
}
// expected-error @+1 {{'piper.program' op parameter @w is shared by device groups that overlap; its gradient cannot be summed once per copy}}
piper.program @q {
  %g0, %s0 = piper.task @src() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %b0 = piper.task @bwd(%g0) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = B>} : (tensor<4xf32>) -> !piper.token
  %g1, %s1 = piper.task @src() {devices = #piper.group<1, 2>, tag = #piper.tag<PP = 1, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %b1 = piper.task @bwd(%g1) {devices = #piper.group<1, 2>, tag = #piper.tag<PP = 1, PASS = B>} : (tensor<4xf32>) -> !piper.token
}
