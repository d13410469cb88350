// The shard_tensor directive (compiler/transforms/TensorParallel.cpp) as its
// own pass with typed options, which rewrites a model exactly as the JSON
// directive does (the diffs), records tp in the module's #piper.mesh, and
// is checked by the one verifier of directives.
// RUN: piperc model llama --layers 1 --hidden 16 --heads 4 --kv-heads 2 --ffn 32 --vocab 32 --seq 8 --batch 2 -o %t.mlir
// RUN: piper-opt %t.mlir "-piper-shard-tensor=tp=2 sequence-parallel=true" | FileCheck %s --check-prefix=SP
// RUN: piper-opt %t.mlir "-piper-shard-tensor=tp=2 sequence-parallel=true" > %t.sp.mlir
// RUN: piper-opt %t.mlir '-piper-apply-directive=directive={{"op":"shard_tensor","tp":2,"sequence_parallel":true}}' | diff - %t.sp.mlir
// RUN: piper-opt %t.mlir "-piper-shard-tensor=tp=2 vocab-parallel=false block=1 stream=t" | FileCheck %s --check-prefix=BLOCK
// RUN: not piper-opt %t.mlir "-piper-shard-tensor=tp=2 block=7" 2>&1 | FileCheck %s --check-prefix=NO-BLOCK
// RUN: not piper-opt %t.mlir "-piper-shard-tensor=tp=2 block=-3" 2>&1 | FileCheck %s --check-prefix=NEG-BLOCK
// RUN: not piper-opt %t.mlir -piper-shard-tensor=tp=1 2>&1 | FileCheck %s --check-prefix=ONE
//
// Then models it cannot split: each an error at the op, naming the
// directive, from the pass and from the JSON directive alike.
// RUN: piper-opt %s -split-input-file -piper-shard-tensor=tp=2 -verify-diagnostics
// RUN: piper-opt %s -split-input-file '-piper-apply-directive=directive={{"op":"shard_tensor","tp":2}}' -verify-diagnostics

// SP: module attributes {piper.mesh = #piper.mesh<tp = 2>, piper.tensor_parallel_stream = "tp_stream"}
// SP-LABEL: piper.segment @embed(
// SP: piper.tp_reduce
// SP-NEXT: piper.sp_split
// SP-LABEL: piper.segment @block0(
// SP: piper.sp_all_gather
// SP: piper.sp_reduce_scatter
// SP: piper.sp_gather
// SP-LABEL: piper.segment @head(
// SP: piper.tp_copy
// SP: piper.vocab_ce_stats
// SP: piper.vocab_cross_entropy

// Block 1 only, the embedding and head whole: no vocabulary ops.
// BLOCK: module attributes {piper.mesh = #piper.mesh<tp = 2>, piper.tensor_parallel_stream = "t"}
// BLOCK-NOT: piper.vocab_
// BLOCK: piper.tp_copy
// BLOCK-NOT: piper.vocab_

// NO-BLOCK: error: 'piper.program' op directive #0 (piper-shard-tensor tp=2 block=7): the model has no block 7 (its blocks are 0 to 2)
// NEG-BLOCK: error: directive #0 (piper-shard-tensor tp=2 block=-3): filter block must be an index from 0 to 1048575 or "*", got -3
// ONE: error: directive #0 (piper-shard-tensor tp=1): "tp" must be between 2 and 1048576, got 1

// A core whose input is not a linear layer of its own.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{block 1's piper.gelu does not read a linear layer of its own (the column-parallel half of a tensor-parallel layer)}}
    %g = piper.gelu %x : tensor<4x8xf32>
    piper.yield %g : tensor<4x8xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  }
}

// -----

// A core read twice: no single row-parallel layer after it.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @up : tensor<8x8xf32> init normal(2.0e-02)
  piper.param @down : tensor<8x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %u = piper.param_ref @up : tensor<8x8xf32>
    %h = piper.linear %x, %u : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{block 1's piper.gelu has more than one reader; tensor parallelism needs one linear layer after it (the row-parallel half)}}
    %g = piper.gelu %h : tensor<4x8xf32>
    %v = piper.param_ref @down : tensor<8x8xf32>
    %o = piper.linear %g, %v : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %s = piper.add %o, %g : tensor<4x8xf32>
    piper.yield %s : tensor<4x8xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  }
}

// -----

// A weight split by the rewrite but also read elsewhere.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @up : tensor<8x8xf32> init normal(2.0e-02)
  piper.param @down : tensor<8x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{@up is split by tensor parallelism, but also read by piper.linear outside the tensor-parallel layers}}
    %u = piper.param_ref @up : tensor<8x8xf32>
    %h = piper.linear %x, %u : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %g = piper.gelu %h : tensor<4x8xf32>
    %v = piper.param_ref @down : tensor<8x8xf32>
    %o = piper.linear %g, %v : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %z = piper.linear %o, %u : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    piper.yield %z : tensor<4x8xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  }
}

// -----

// Vocabulary parallelism (on by default): a loss whose logits are not an
// LM head's (a linear layer of their own).
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @up : tensor<8x8xf32> init normal(2.0e-02)
  piper.param @down : tensor<8x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>, %tgt: tensor<2x2xi32>) -> tensor<f32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %u = piper.param_ref @up : tensor<8x8xf32>
    %h = piper.linear %x, %u : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %g = piper.gelu %h : tensor<4x8xf32>
    %dn = piper.param_ref @down : tensor<8x8xf32>
    %y = piper.linear %g, %dn : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    // expected-error @+1 {{vocabulary parallelism: the loss's logits are not computed by a linear layer of their own (the LM head)}}
    %loss = piper.cross_entropy %y, %tgt : (tensor<4x8xf32>, tensor<2x2xi32>) -> tensor<f32>
    piper.yield %loss : tensor<f32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %l, %d1 = piper.task @b(%tok, %tgt) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
  }
}

// -----

// An embedding table that is not a parameter.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @up : tensor<8x8xf32> init normal(2.0e-02)
  piper.param @down : tensor<8x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %w2 = piper.add %w, %w : tensor<16x8xf32>
    // expected-error @+1 {{vocabulary parallelism: the embedding's table is not a parameter}}
    %x = piper.embedding %ids, %w2 : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %u = piper.param_ref @up : tensor<8x8xf32>
    %h = piper.linear %x, %u : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %g = piper.gelu %h : tensor<4x8xf32>
    %dn = piper.param_ref @down : tensor<8x8xf32>
    %y = piper.linear %g, %dn : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    piper.yield %y : tensor<4x8xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  }
}

// -----

// An LM head whose bias is not a parameter.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @up : tensor<8x8xf32> init normal(2.0e-02)
  piper.param @down : tensor<8x8xf32> init normal(2.0e-02)
  piper.param @head : tensor<8x16xf32> init normal(2.0e-02)
  piper.param @bias : tensor<4x16xf32> init zeros(0.0)
  piper.segment @b(%ids: tensor<2x2xi32>, %tgt: tensor<2x2xi32>) -> tensor<f32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %u = piper.param_ref @up : tensor<8x8xf32>
    %h = piper.linear %x, %u : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %g = piper.gelu %h : tensor<4x8xf32>
    %dn = piper.param_ref @down : tensor<8x8xf32>
    %y = piper.linear %g, %dn : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    %hw = piper.param_ref @head : tensor<8x16xf32>
    %b0 = piper.param_ref @bias : tensor<4x16xf32>
    %b1 = piper.bias_grad %b0 : (tensor<4x16xf32>) -> tensor<16xf32>
    // expected-error @+1 {{vocabulary parallelism: the LM head's bias is not a parameter}}
    %logits = piper.linear %y, %hw, %b1 : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    %loss = piper.cross_entropy %logits, %tgt : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
    piper.yield %loss : tensor<f32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %l, %d1 = piper.task @b(%tok, %tgt) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
  }
}

// -----

// Replicated key/value heads (1 head over 2 members) under a biased q|k|v
// projection: refused.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @qkv : tensor<8x16xf32> init normal(2.0e-02)
  piper.param @qkv_b : tensor<16xf32> init zeros(0.0)
  piper.param @o : tensor<8x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %q = piper.param_ref @qkv : tensor<8x16xf32>
    %qb = piper.param_ref @qkv_b : tensor<16xf32>
    %h = piper.linear %x, %q, %qb : (tensor<4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>
    // expected-error @+1 {{block 1's piper.attention has a bias on its q|k|v projection, which replicated key/value heads (1 key/value heads over tensor parallelism of 2) do not support}}
    %a, %a_lse = piper.attention %h {heads = 2 : i64, kv_heads = 1 : i64, seq = 2 : i64} : (tensor<4x16xf32>) -> (tensor<4x8xf32>, tensor<4x4xf32>)
    %v = piper.param_ref @o : tensor<8x8xf32>
    %y = piper.linear %a, %v : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
    piper.yield %y : tensor<4x8xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  }
}

// -----

// Qwen3's q/k norm between the q|k|v projection and the attention joins the
// layer only when the attention is its one reader.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @wqkv : tensor<8x12xf32> init normal(2.0e-02)
  piper.param @qk : tensor<4xf32> init ones(0.0)
  piper.param @wo : tensor<4x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> (tensor<4x8xf32>, tensor<4x12xf32>) attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %q = piper.param_ref @wqkv : tensor<8x12xf32>
    %qkv = piper.linear %x, %q : (tensor<4x8xf32>, tensor<8x12xf32>) -> tensor<4x12xf32>
    %g = piper.param_ref @qk : tensor<4xf32>
    %n = piper.qk_norm %qkv, %g {heads = 2 : i64} : (tensor<4x12xf32>, tensor<4xf32>) -> tensor<4x12xf32>
    // expected-error @+1 {{block 1's piper.attention reads a q/k norm that has other readers}}
    %a, %a_lse = piper.attention %n {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
    %o = piper.param_ref @wo : tensor<4x8xf32>
    %y = piper.linear %a, %o : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    piper.yield %y, %n : tensor<4x8xf32>, tensor<4x12xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %n, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, tensor<4x12xf32>, !piper.token)
  }
}

// -----

// The q/k norm's weight, whole on every member with its gradient summed over
// the group, must be a parameter.
module {
  piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
  piper.param @wqkv : tensor<8x12xf32> init normal(2.0e-02)
  piper.param @wg : tensor<8x4xf32> init normal(2.0e-02)
  piper.param @wo : tensor<4x8xf32> init normal(2.0e-02)
  piper.segment @b(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @wte : tensor<16x8xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
    %wg = piper.param_ref @wg : tensor<8x4xf32>
    %t = piper.linear %x, %wg : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
    %g = piper.rms_norm_grad_weight %t, %t : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4xf32>
    %q = piper.param_ref @wqkv : tensor<8x12xf32>
    %qkv = piper.linear %x, %q : (tensor<4x8xf32>, tensor<8x12xf32>) -> tensor<4x12xf32>
    // expected-error @+1 {{the q/k norm's weight must be a parameter}}
    %n = piper.qk_norm %qkv, %g {heads = 2 : i64} : (tensor<4x12xf32>, tensor<4xf32>) -> tensor<4x12xf32>
    %a, %a_lse = piper.attention %n {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
    %o = piper.param_ref @wo : tensor<4x8xf32>
    %y = piper.linear %a, %o : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    piper.yield %y : tensor<4x8xf32>
  }
  piper.program @m {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %y, %d1 = piper.task @b(%tok) {tag = #piper.tag<block = 1>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  }
}
