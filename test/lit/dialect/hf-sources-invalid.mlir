// Every verifier diagnostic of the Hugging Face attributes
// (docs/hugging-face.md): a parameter's checkpoint tensors must fit its
// global tensor and cover it exactly.
// RUN: piper-opt %s -split-input-file -verify-diagnostics

// A fused q|k weight made of two transposed nn.Linear weights: valid, also
// as a tensor-parallel slice (the sources describe the global tensor) and
// as a member's block of experts.
piper.param @qk : tensor<4x6xf32> init zeros(0.0) {piper.hf_sources = [#piper.hf_source<"q.weight", shape = [4, 4], transpose = true, index = 0, offset = 0>, #piper.hf_source<"k.weight", shape = [2, 4], transpose = true, index = 0, offset = 4>]}
piper.param @qk2 : tensor<4x3xf32> init zeros(0.0) {tensor_slice = #piper.tensor_slice<dim = 1, members = 2, parts = [4, 2]>, piper.hf_sources = [#piper.hf_source<"q.weight", shape = [4, 4], transpose = true, index = 0, offset = 0>, #piper.hf_source<"k.weight", shape = [2, 4], transpose = true, index = 0, offset = 4>]}
piper.param @experts : tensor<1x4x2xf32> init zeros(0.0) {expert_members = 2 : i64, piper.hf_sources = [#piper.hf_source<"e0.weight", shape = [2, 4], transpose = true, index = 0, offset = 0>, #piper.hf_source<"e1.weight", shape = [2, 4], transpose = true, index = 1, offset = 0>]}
module attributes {piper.hf_config = "{}"} {}

// -----

// expected-error @+1 {{hf_source 'w' must have a 1-D or 2-D positive shape}}
piper.param @w : tensor<4xf32> init zeros(0.0) {piper.hf_sources = [#piper.hf_source<"w", shape = [0], transpose = false, index = 0, offset = 0>]}

// -----

// expected-error @+1 {{hf_source 'w': only a 2-D tensor can be transposed}}
piper.param @w : tensor<4xf32> init zeros(0.0) {piper.hf_sources = [#piper.hf_source<"w", shape = [4], transpose = true, index = 0, offset = 0>]}

// -----

// expected-error @+1 {{Hugging Face tensor 'k.weight' does not fit parameter @w of global shape [4, 6]}}
piper.param @w : tensor<4x6xf32> init zeros(0.0) {piper.hf_sources = [#piper.hf_source<"q.weight", shape = [4, 4], transpose = true, index = 0, offset = 0>, #piper.hf_source<"k.weight", shape = [2, 4], transpose = true, index = 0, offset = 5>]}

// -----

// expected-error @+1 {{the Hugging Face tensors of parameter @w cover 16 of its 24 elements}}
piper.param @w : tensor<4x6xf32> init zeros(0.0) {piper.hf_sources = [#piper.hf_source<"q.weight", shape = [4, 4], transpose = true, index = 0, offset = 0>]}

// -----

// An expert index beyond the global experts.
// expected-error @+1 {{Hugging Face tensor 'e2.weight' does not fit parameter @w of global shape [2, 4, 2]}}
piper.param @w : tensor<1x4x2xf32> init zeros(0.0) {expert_members = 2 : i64, piper.hf_sources = [#piper.hf_source<"e2.weight", shape = [2, 4], transpose = true, index = 2, offset = 0>]}

// -----

// expected-error @+1 {{'piper.hf_sources' must hold #piper.hf_source attributes, got "w"}}
piper.param @w : tensor<4xf32> init zeros(0.0) {piper.hf_sources = ["w"]}

// -----

// expected-error @+1 {{'piper.hf_sources' must be an array of #piper.hf_source on a piper.param}}
module attributes {piper.hf_sources = []} {}

// -----

// expected-error @+1 {{'piper.hf_config' must be a string on the module, got 3 : i64}}
module attributes {piper.hf_config = 3} {}

// -----

// Llama 3.1's rotary scaling (#piper.rope_llama3): valid, then each of
// its checks.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64, rope_theta = 5.0e+05 : f64, rope_scaling = #piper.rope_llama3<factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 64>} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op rope_scaling needs rope_theta}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64, rope_scaling = #piper.rope_llama3<factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 64>} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// expected-error @+1 {{rope_llama3 factor must be positive, got 0.000000e+00}}
piper.param @w : tensor<4xf32> init zeros(0.0) {scaling = #piper.rope_llama3<factor = 0.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 64>}

// -----

// expected-error @+1 {{rope_llama3 needs 0 < low_freq_factor < high_freq_factor, got 4.000000e+00 and 1.000000e+00}}
piper.param @w : tensor<4xf32> init zeros(0.0) {scaling = #piper.rope_llama3<factor = 8.0, low_freq_factor = 4.0, high_freq_factor = 1.0, original_max_position = 64>}

// -----

// expected-error @+1 {{rope_llama3 original_max_position must be positive, got 0}}
piper.param @w : tensor<4xf32> init zeros(0.0) {scaling = #piper.rope_llama3<factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 0>}
