// Every verifier diagnostic of the value-level collectives, one case per split.
// RUN: piper-opt %s -allow-unregistered-dialect -split-input-file -verify-diagnostics
piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() {
  piper.yield
}
piper.program @p {
  %a = piper.task @f() {tag = #piper.tag<>} : () -> !piper.token
  // expected-error @+1 {{'piper.all_reduce' op sums either tensors (inputs) or gradient accumulators (grads), exactly one of them}}
  %t = piper.all_reduce after(%a) {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xf32> {
  %e = "test.make"() : () -> tensor<4x2xf32>
  piper.yield %e : tensor<4x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.all_reduce' op sums either tensors (inputs) or gradient accumulators (grads), exactly one of them}}
  %r, %t = piper.all_reduce grads [@w] %x : tensor<4x2xf32> -> tensor<4x2xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xf32> {
  %e = "test.make"() : () -> tensor<4x2xf32>
  piper.yield %e : tensor<4x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.all_reduce' op results must have the types of the inputs}}
  %r, %t = piper.all_reduce %x : tensor<4x2xf32> -> tensor<2x4xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xi32> {
  %e = "test.make"() : () -> tensor<4x2xi32>
  piper.yield %e : tensor<4x2xi32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xi32>, !piper.token)
  // expected-error @+1 {{'piper.all_reduce' op sums f32 tensors, not 'tensor<4x2xi32>'}}
  %r, %t = piper.all_reduce %x : tensor<4x2xi32> -> tensor<4x2xi32> {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<10x2xf32> {
  %e = "test.make"() : () -> tensor<10x2xf32>
  piper.yield %e : tensor<10x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<10x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.reduce_scatter' op result must have ceil(10 / 3) = 4 rows, the largest slice, not 3}}
  %r, %t = piper.reduce_scatter %x {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<10x2xf32> -> tensor<3x2xf32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<10x2xf32> {
  %e = "test.make"() : () -> tensor<10x2xf32>
  piper.yield %e : tensor<10x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<10x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.reduce_scatter' op input 'tensor<10x2xf32>' and result 'tensor<4x3xf32>' must differ in dimension 0 only}}
  %r, %t = piper.reduce_scatter %x {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<10x2xf32> -> tensor<4x3xf32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<10x2xf32> {
  %e = "test.make"() : () -> tensor<10x2xf32>
  piper.yield %e : tensor<10x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<10x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.reduce_scatter' op devices must be listed in increasing order: member i is the i-th smallest rank}}
  %r, %t = piper.reduce_scatter %x {devices = #piper.group<2, 0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<10x2xf32> -> tensor<4x2xf32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<3x2xf32> {
  %e = "test.make"() : () -> tensor<3x2xf32>
  piper.yield %e : tensor<3x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<3x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.all_gather' op input must have ceil(10 / 3) = 4 rows, the largest slice, not 3}}
  %r, %t = piper.all_gather %x {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<3x2xf32> -> tensor<10x2xf32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xf32> {
  %e = "test.make"() : () -> tensor<4x2xf32>
  piper.yield %e : tensor<4x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, !piper.token)
  // expected-error @+1 {{a device group names device 1 twice}}
  %r, %t = piper.all_gather %x {devices = #piper.group<1, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<4x2xf32> -> tensor<8x2xf32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xf32> {
  %e = "test.make"() : () -> tensor<4x2xf32>
  piper.yield %e : tensor<4x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.all_gather' op result element type 'i32' differs from the input's 'f32'}}
  %r, %t = piper.all_gather %x {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<4x2xf32> -> tensor<8x2xi32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.segment @f() -> tensor<4x2xf32> {
  %e = "test.make"() : () -> tensor<4x2xf32>
  piper.yield %e : tensor<4x2xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, !piper.token)
  // expected-error @+1 {{'piper.all_reduce' op collective id must be non-negative, got -1}}
  %r, %t = piper.all_reduce %x : tensor<4x2xf32> -> tensor<4x2xf32> {collective = -1, devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.segment @f() -> (tensor<4x2xf32>, tensor<3xi32>) {
  %e = "test.make"() : () -> tensor<4x2xf32>
  %c = "test.make"() : () -> tensor<3xi32>
  piper.yield %e, %c : tensor<4x2xf32>, tensor<3xi32>
}
piper.program @p {
  %x, %n, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<4x2xf32>, tensor<3xi32>, !piper.token)
  // expected-error @+1 {{'piper.all_to_all' op counts must have one entry per member (2), not 3}}
  %r, %rc, %t = piper.all_to_all %x, %n {devices = #piper.group<0, 1>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>} : tensor<4x2xf32>, tensor<3xi32> -> tensor<8x2xf32>, tensor<3xi32>
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op subgroups, when given, are at least one group}}
  %t = piper.all_reduce grads [@w] {subgroups = [], devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op subgroups must have one size, got 2 and 1 members}}
  %t = piper.all_reduce grads [@w] {subgroups = [#piper.group<0, 1>, #piper.group<2>], devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op subgroup members must be listed in increasing order}}
  %t = piper.all_reduce grads [@w] {subgroups = [#piper.group<1, 0>, #piper.group<2, 3>], devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op subgroup member 5 is not in the group}}
  %t = piper.all_reduce grads [@w] {subgroups = [#piper.group<0, 1>, #piper.group<2, 5>], devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op device 1 is in two subgroups}}
  %t = piper.all_reduce grads [@w] {subgroups = [#piper.group<0, 1>, #piper.group<1, 2>], devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

piper.param @w : tensor<4x2xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op the subgroups must cover the group: 2 of its 4 devices are in one}}
  %t = piper.all_reduce grads [@w] {subgroups = [#piper.group<0, 1>], devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

// Slices follow the subgroup: 10 rows over pairs are 5 per member.
piper.segment @f() -> tensor<10x4xf32> {
  %e = "test.make"() : () -> tensor<10x4xf32>
  piper.yield %e : tensor<10x4xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<10x4xf32>, !piper.token)
  // expected-error @+1 {{'piper.reduce_scatter' op result must have ceil(10 / 2) = 5 rows, the largest slice, not 3}}
  %s, %t = piper.reduce_scatter %x {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"s", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<>} : tensor<10x4xf32> -> tensor<3x4xf32>
}

// -----

// An expert exchange needs groups of two devices at least.
piper.segment @e(%x: tensor<8x4xf32>, %n: tensor<2xi32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'piper.ep_exchange' op attribute 'members' failed to satisfy constraint: 64-bit signless integer attribute whose minimum value is 2}}
  %r, %c = piper.ep_exchange %x, %n {members = 1 : i64, stream = "ep_stream"} : tensor<8x4xf32>, tensor<2xi32>
  piper.yield %r : tensor<8x4xf32>
}

// -----

// And the stream it exchanges on.
piper.segment @e(%x: tensor<8x4xf32>, %n: tensor<2xi32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'piper.ep_exchange' op requires attribute 'stream'}}
  %r, %c = piper.ep_exchange %x, %n {members = 2 : i64} : tensor<8x4xf32>, tensor<2xi32>
  piper.yield %r : tensor<8x4xf32>
}
