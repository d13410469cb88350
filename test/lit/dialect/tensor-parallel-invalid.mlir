// Every verifier diagnostic of tensor parallelism's attributes and ops
// (docs/tensor-parallel.md), one case per split.
// RUN: piper-opt %s -split-input-file -verify-diagnostics

// A slice needs at least two members.
// expected-error @+1 {{tensor_slice members must be at least 2, got 1}}
piper.param @w : tensor<4x4xf32> init zeros(0.0) {tensor_slice = #piper.tensor_slice<dim = 1, members = 1>}

// -----

// Each fused part splits into equal blocks.
// expected-error @+1 {{tensor_slice part 3 is not a positive multiple of the 2 members}}
piper.param @w : tensor<4x4xf32> init zeros(0.0) {tensor_slice = #piper.tensor_slice<dim = 1, members = 2, parts = [3, 5]>}

// -----

// expected-error @+1 {{'piper.param' op tensor_slice dim 2 is not a dimension of 'tensor<4x4xf32>'}}
piper.param @w : tensor<4x4xf32> init zeros(0.0) {tensor_slice = #piper.tensor_slice<dim = 2, members = 2>}

// -----

// The parts make up the global extent: members x the local one.
// expected-error @+1 {{'piper.param' op tensor_slice parts sum to 6, not 2 x 4}}
piper.param @w : tensor<4x4xf32> init zeros(0.0) {tensor_slice = #piper.tensor_slice<dim = 1, members = 2, parts = [2, 4]>}

// -----

// expected-error @+1 {{'piper.param' op a parameter cannot be both expert blocks and a tensor-parallel slice}}
piper.param @w : tensor<2x4x4xf32> init zeros(0.0) {expert_members = 2 : i64, tensor_slice = #piper.tensor_slice<dim = 2, members = 2>}

// -----

// The degrees live on the module's mesh, one of them at least 2.
// expected-error @+1 {{'piper.mesh' must be a #piper.mesh of tp or cp at least 2 on the module, got #piper.mesh<tp = 1, cp = 1>}}
module attributes {piper.mesh = #piper.mesh<tp = 1>} {
}

// -----

// expected-error @+1 {{'piper.mesh' must be a #piper.mesh of tp or cp at least 2 on the module, got 2 : i64}}
module attributes {piper.mesh = 2 : i64} {
}

// -----

module {
  // expected-error @+1 {{'piper.mesh' must be a #piper.mesh of tp or cp at least 2 on the module, got #piper.mesh<tp = 2>}}
  piper.param @w : tensor<4xf32> init zeros(0.0) {piper.mesh = #piper.mesh<tp = 2>}
}

// -----

// expected-error @+1 {{mesh: tp must be at least 1, got 0}}
module attributes {piper.mesh = #piper.mesh<tp = 0, cp = 2>} {
}

// -----

// expected-error @+1 {{repeated mesh axis 'tp' (a mesh has tp and cp)}}
module attributes {piper.mesh = #piper.mesh<tp = 2, tp = 2>} {
}

// -----

// expected-error @+1 {{unknown mesh axis 'dp' (a mesh has tp and cp)}}
module attributes {piper.mesh = #piper.mesh<tp = 2, dp = 2>} {
}

// -----

// expected-error @+1 {{mesh: cp must be at least 1, got -1}}
module attributes {piper.mesh = #piper.mesh<tp = 2, cp = -1>} {
}

// -----

// expected-error @+1 {{mesh: pp 1 x dp 1 x cp 2048 x tp 1024 exceeds the 1048576 ranks of a world}}
module attributes {piper.mesh = #piper.mesh<tp = 1024, cp = 2048>} {
}

// -----

module {
  // expected-error @+1 {{'piper.tensor_parallel_stream' must be a stream name on the module, got "tp_stream"}}
  piper.param @w : tensor<4xf32> init zeros(0.0) {piper.tensor_parallel_stream = "tp_stream"}
}

// -----

piper.segment @s(%x: tensor<8x4xf32>, %b: tensor<3xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'piper.bias_add' op bias must have 4 elements}}
  %y = piper.bias_add %x, %b : (tensor<8x4xf32>, tensor<3xf32>) -> tensor<8x4xf32>
  piper.yield %y : tensor<8x4xf32>
}

// -----

piper.segment @s(%x: tensor<8x4xf32>, %b: tensor<4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'piper.bias_add' op result type must equal the input type}}
  %y = piper.bias_add %x, %b : (tensor<8x4xf32>, tensor<4xf32>) -> tensor<4x8xf32>
  piper.yield %x : tensor<8x4xf32>
}

// -----

// Vocabulary parallelism (docs/tensor-parallel.md §5c).
piper.segment @s(%ids: tensor<2x4xi32>, %t: tensor<4x8xf32>) -> tensor<8x8xf32> {
  // expected-error @+1 {{'piper.embedding' op members must be at least 2, got 1}}
  %y = piper.embedding %ids, %t {members = 1 : i64} : (tensor<2x4xi32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  piper.yield %y : tensor<8x8xf32>
}

// -----

piper.segment @s(%l: tensor<8x16xf32>, %t: tensor<2x4xi32>) -> tensor<8x9xf32> {
  // expected-error @+1 {{'piper.vocab_ce_stats' op members must be at least 2, got 1}}
  %s = piper.vocab_ce_stats %l, %t {members = 1 : i64} : (tensor<8x16xf32>, tensor<2x4xi32>) -> tensor<8x9xf32>
  piper.yield %s : tensor<8x9xf32>
}

// -----

piper.segment @s(%l: tensor<8x16xf32>, %t: tensor<2x4xi32>) -> tensor<8x5xf32> {
  // expected-error @+1 {{'piper.vocab_ce_stats' op statistics must be [8, 9] (4 members + 1 columns), got 'tensor<8x5xf32>'}}
  %s = piper.vocab_ce_stats %l, %t {members = 2 : i64} : (tensor<8x16xf32>, tensor<2x4xi32>) -> tensor<8x5xf32>
  piper.yield %s : tensor<8x5xf32>
}

// -----

piper.segment @s(%l: tensor<6x16xf32>, %t: tensor<2x4xi32>) -> tensor<6x9xf32> {
  // expected-error @+1 {{'piper.vocab_ce_stats' op logits have 6 rows but targets hold 8 tokens}}
  %s = piper.vocab_ce_stats %l, %t {members = 2 : i64} : (tensor<6x16xf32>, tensor<2x4xi32>) -> tensor<6x9xf32>
  piper.yield %s : tensor<6x9xf32>
}

// -----

piper.segment @s(%s: tensor<8x13xf32>, %l: tensor<8x16xf32>, %t: tensor<2x4xi32>) -> tensor<f32> {
  // expected-error @+1 {{'piper.vocab_cross_entropy' op statistics must be [8, 9] (4 members + 1 columns), got 'tensor<8x13xf32>'}}
  %loss = piper.vocab_cross_entropy %s, %l, %t {members = 2 : i64} : (tensor<8x13xf32>, tensor<8x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  piper.yield %loss : tensor<f32>
}
