// Every verifier diagnostic of the ZeRO collectives and the expert-parallel
// layout ops, one case per split.
// RUN: piper-opt %s -allow-unregistered-dialect -split-input-file -verify-diagnostics
piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.reduce_scatter_grads' op zero must be the ZeRO stage 1, 2 or 3, not 4}}
  %t = piper.reduce_scatter_grads [@w] {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 4 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.reduce_scatter_grads' op names parameter @w twice}}
  %t = piper.reduce_scatter_grads [@w, @w] {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 1 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.reduce_scatter_grads' op must name at least one parameter}}
  %t = piper.reduce_scatter_grads [] {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 1 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_gather_params' op shards over its whole group, or under tensor parallelism over the data replicas of each member: subgroups {t, t + T, ...} of at least 2}}
  %t = piper.all_gather_params [@w] {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, subgroups = [#piper.group<0>, #piper.group<1>], tag = #piper.tag<>, zero = 1 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.reduce_scatter_grads' op shards over its whole group, or under tensor parallelism over the data replicas of each member: subgroups {t, t + T, ...} of at least 2}}
  %t = piper.reduce_scatter_grads [@w] {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<>, zero = 1 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_gather_params' op runs within one device class: no collective id}}
  %t = piper.all_gather_params [@w] {collective = 3 : i64, devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 1 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_gather_params' op gathers into new tensors only under ZeRO-3 (the parameters are shards); stage 2 gathers in place}}
  %w, %t = piper.all_gather_params [@w] -> tensor<4x2xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 2 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_gather_params' op tensor 0 has type 'tensor<2x4xf32>' but parameter @w is 'tensor<4x2xf32>'}}
  %w, %t = piper.all_gather_params [@w] -> tensor<2x4xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 3 : i64}
}

// -----

piper.program @p {
  // expected-error @+1 {{'piper.all_gather_params' op references unknown parameter @nope}}
  %t = piper.all_gather_params [@nope] {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 1 : i64}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.param @v : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xf32> {
  %e = "test.make"() : () -> tensor<4x2xf32>
  piper.yield %e : tensor<4x2xf32>
}
piper.program @p {
  %g, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.reduce_scatter_grads' op takes one tensor per parameter (2), not 1}}
  %t = piper.reduce_scatter_grads [@w, @v] %g : tensor<4x2xf32> after(%a) {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>, zero = 2 : i64}
}

// -----

piper.segment @s(%i: tensor<8x2xi32>) {
  // expected-error @+1 {{'piper.moe_ep_counts' op members 3 must divide experts 4}}
  %a, %b, %c = piper.moe_ep_counts %i {capacity = 2 : i64, experts = 4 : i64, members = 3 : i64} : (tensor<8x2xi32>) -> (tensor<3xi32>, tensor<4x1xi32>, tensor<3xi32>)
  piper.yield
}

// -----

piper.segment @s(%i: tensor<8x2xi32>) {
  // expected-error @+1 {{'piper.moe_ep_counts' op member counts must have one entry per member}}
  %a, %b, %c = piper.moe_ep_counts %i {capacity = 2 : i64, experts = 4 : i64, members = 2 : i64} : (tensor<8x2xi32>) -> (tensor<3xi32>, tensor<4x1xi32>, tensor<2xi32>)
  piper.yield
}

// -----

piper.segment @s(%x: tensor<6x3xf32>, %c: tensor<4x1xi32>) {
  // expected-error @+1 {{'piper.moe_ep_pack' op rows must be experts * capacity = 8}}
  %p = piper.moe_ep_pack %x, %c {capacity = 2 : i64, experts = 4 : i64} : (tensor<6x3xf32>, tensor<4x1xi32>) -> tensor<6x3xf32>
  piper.yield
}

// -----

piper.segment @s(%x: tensor<8x3xf32>, %c: tensor<2x1xi32>) {
  // expected-error @+1 {{'piper.moe_ep_gather' op expert counts must be [4, 1]}}
  %p = piper.moe_ep_gather %x, %c {capacity = 2 : i64, experts = 4 : i64, members = 2 : i64} : (tensor<8x3xf32>, tensor<2x1xi32>) -> tensor<8x3xf32>
  piper.yield
}

// -----

piper.segment @s(%x: tensor<8x3xf32>, %c: tensor<4x1xi32>) {
  // expected-error @+1 {{'piper.moe_ep_scatter' op experts, capacity and members must be positive}}
  %p = piper.moe_ep_scatter %x, %c {capacity = 2 : i64, experts = 4 : i64, members = 0 : i64} : (tensor<8x3xf32>, tensor<4x1xi32>) -> tensor<8x3xf32>
  piper.yield
}
