// The ring's lowering after placement (piper-lower-context-parallel): without
// context_parallel's degree on the module, a stray ring op is an error.
// RUN: piper-opt %s -split-input-file -piper-lower-context-parallel -verify-diagnostics

piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{'piper.cp_attention' op needs the module's context-parallel degree (the cp of piper.mesh, set by context_parallel)}}
  %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

// A ring of another degree than the module's.
module attributes {piper.mesh = #piper.mesh<cp = 4>} {
  piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<8x16xf32> {
    // expected-error @+1 {{'piper.cp_attention' op is split over 2 members, but the module's context-parallel degree is 4}}
    %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
    piper.yield %y : tensor<8x16xf32>
  }
  piper.program @model {
  }
}

// -----

// A stray Ulysses marker without the module's degree.
piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<16x24xf32> {
  // expected-error @+1 {{'piper.cp_seq_to_heads' op needs the module's context-parallel degree (the cp of piper.mesh, set by context_parallel)}}
  %h = piper.cp_seq_to_heads %qkv {cp = 2 : i64, heads = 2 : i64, kv_heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> tensor<16x24xf32>
  piper.yield %h : tensor<16x24xf32>
}

// -----

module attributes {piper.mesh = #piper.mesh<cp = 4>} {
  piper.segment @s(%y: tensor<16x8xf32>) -> tensor<8x16xf32> {
    // expected-error @+1 {{'piper.cp_heads_to_seq' op is split over 2 members, but the module's context-parallel degree is 4}}
    %x = piper.cp_heads_to_seq %y {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<16x8xf32>) -> tensor<8x16xf32>
    piper.yield %x : tensor<8x16xf32>
  }
  piper.program @model {
  }
}
