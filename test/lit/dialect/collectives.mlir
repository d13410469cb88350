// The value-level collectives survive print -> parse in the custom and the
// generic form, and their verifiers reject malformed ones.
// RUN: piper-opt %s -allow-unregistered-dialect | piper-opt -allow-unregistered-dialect | FileCheck %s
// RUN: piper-opt %s -allow-unregistered-dialect -mlir-print-op-generic | piper-opt -allow-unregistered-dialect | FileCheck %s

// CHECK-LABEL: piper.program @p
// CHECK: [[S:%[^,]+]], [[SD:%[^ ]+]] = piper.all_reduce %{{.*}} : tensor<10x4xf32> -> tensor<10x4xf32> after(%{{.*}}) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 1>}
// CHECK: piper.reduce_scatter [[S]] after([[SD]]) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<10x4xf32> -> tensor<4x4xf32>
// CHECK: piper.all_gather %{{.*}} {collective = 3 : i64, devices = #piper.group<0, 1, 2>, stream = #piper.stream<"gather_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<4x4xf32> -> tensor<10x4xf32>
// CHECK: piper.all_to_all %{{.*}}, %{{.*}} {devices = #piper.group<0, 1>, stream = #piper.stream<"ep_stream", comm>, tag = #piper.tag<PP = 0, EP = 0, MB = 0>} : tensor<8x4xf32>, tensor<2xi32> -> tensor<16x4xf32>, tensor<2xi32>
// CHECK: piper.all_reduce grads [@w] after(%{{.*}}) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @f() -> (tensor<10x4xf32>, tensor<8x4xf32>, tensor<2xi32>) {
  %x = piper.param_ref @w : tensor<4xf32>
  %a = "test.make"() : () -> tensor<10x4xf32>
  %b = "test.make"() : () -> tensor<8x4xf32>
  %c = "test.make"() : () -> tensor<2xi32>
  piper.yield %a, %b, %c : tensor<10x4xf32>, tensor<8x4xf32>, tensor<2xi32>
}
piper.program @p {
  %x, %y, %n, %t = piper.task @f() {tag = #piper.tag<PP = 0>} : () -> (tensor<10x4xf32>, tensor<8x4xf32>, tensor<2xi32>, !piper.token)
  %s, %sd = piper.all_reduce %x : tensor<10x4xf32> -> tensor<10x4xf32> after(%t) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 1>}
  %sh, %rd = piper.reduce_scatter %s after(%sd) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<10x4xf32> -> tensor<4x4xf32>
  %full, %gd = piper.all_gather %sh {collective = 3, devices = #piper.group<0, 1, 2>, stream = #piper.stream<"gather_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<4x4xf32> -> tensor<10x4xf32>
  %z, %rc, %ad = piper.all_to_all %y, %n {devices = #piper.group<0, 1>, stream = #piper.stream<"ep_stream", comm>, tag = #piper.tag<PP = 0, EP = 0, MB = 0>} : tensor<8x4xf32>, tensor<2xi32> -> tensor<16x4xf32>, tensor<2xi32>
  %g = piper.all_reduce grads [@w] after(%gd) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
}

// Subgroups: each member runs with its own part of the group; slice sizes
// and all-to-all counts follow the subgroup's size.
// CHECK-LABEL: piper.program @sub
// CHECK: piper.all_reduce grads [@w] {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, subgroups = [#piper.group<0, 2>, #piper.group<1, 3>], tag = #piper.tag<PP = 0>}
// CHECK: piper.reduce_scatter %{{.*}} {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0>} : tensor<10x4xf32> -> tensor<5x4xf32>
// CHECK: piper.all_to_all %{{.*}}, %{{.*}} {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"ep_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0>} : tensor<8x4xf32>, tensor<2xi32> -> tensor<16x4xf32>, tensor<2xi32>
piper.program @sub {
  %x, %y, %n, %t = piper.task @f() {tag = #piper.tag<PP = 0>} : () -> (tensor<10x4xf32>, tensor<8x4xf32>, tensor<2xi32>, !piper.token)
  %g = piper.all_reduce grads [@w] {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, subgroups = [#piper.group<0, 2>, #piper.group<1, 3>], tag = #piper.tag<PP = 0>}
  %sh, %rd = piper.reduce_scatter %x {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0>} : tensor<10x4xf32> -> tensor<5x4xf32>
  %z, %rc, %ad = piper.all_to_all %y, %n {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"ep_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0>} : tensor<8x4xf32>, tensor<2xi32> -> tensor<16x4xf32>, tensor<2xi32>
}
