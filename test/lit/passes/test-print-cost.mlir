// RUN: piper-opt %s -test-print-cost -o /dev/null | FileCheck %s

// A linear layer costs 2·N·K·M FLOPs, attention 4·N·H·seq, an elementwise op
// one per output element; bytes count every tensor operand and result once.
// CHECK: segment @mlp: flops 544, bytes 768
piper.segment @mlp(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %y = piper.linear %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = piper.gelu %y : tensor<4x8xf32>
  piper.yield %z : tensor<4x8xf32>
}

// CHECK: segment @attn: flops 256, bytes 576
piper.segment @attn(%qkv: tensor<4x24xf32>) -> tensor<4x8xf32> {
  %a, %a_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64} : (tensor<4x24xf32>) -> (tensor<4x8xf32>, tensor<4x4xf32>)
  piper.yield %a : tensor<4x8xf32>
}

// A linear's backward is two products as large as its forward: dx = dy·wᵀ
// is 2·N·K·M (2·4·8·16), so is dw = xᵀ·dy.
// CHECK: segment @mlp_grad: flops 2048, bytes 1792
piper.segment @mlp_grad(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %dy: tensor<4x16xf32>) -> (tensor<4x8xf32>, tensor<8x16xf32>) {
  %dx = piper.linear_grad_input %dy, %w : (tensor<4x16xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>
  %dw = piper.linear_grad_weight %x, %dy : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<8x16xf32>
  piper.yield %dx, %dw : tensor<4x8xf32>, tensor<8x16xf32>
}

// A biased linear's weight and bias gradients in one op: dw's product
// (2·4·8·16) and one addition per element of dy (4·16); it reads x and dy
// once and writes dw and db: 4·(32 + 64 + 128 + 16) bytes.
// CHECK: segment @bias_grads: flops 1088, bytes 960
piper.segment @bias_grads(%x: tensor<4x8xf32>, %dy: tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>) {
  %dw, %db = piper.linear_grad_weight_bias %x, %dy : (tensor<4x8xf32>, tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  piper.yield %dw, %db : tensor<8x16xf32>, tensor<16xf32>
}

// An expert layer: each expert's C rows (2 here) times its [K, M] weight,
// 2·(E·C)·K·M FLOPs forward, input gradient and weight gradient alike
// (2·4·8·16 each).
// CHECK: segment @experts: flops 3072
piper.segment @experts(%x: tensor<4x8xf32>, %w: tensor<2x8x16xf32>, %dy: tensor<4x16xf32>) -> (tensor<4x16xf32>, tensor<4x8xf32>, tensor<2x8x16xf32>) {
  %y = piper.expert_linear %x, %w {experts = 2 : i64} : (tensor<4x8xf32>, tensor<2x8x16xf32>) -> tensor<4x16xf32>
  %dx = piper.expert_linear_grad_input %dy, %w {experts = 2 : i64} : (tensor<4x16xf32>, tensor<2x8x16xf32>) -> tensor<4x8xf32>
  %dw = piper.expert_linear_grad_weight %x, %dy {experts = 2 : i64} : (tensor<4x8xf32>, tensor<4x16xf32>) -> tensor<2x8x16xf32>
  piper.yield %y, %dx, %dw : tensor<4x16xf32>, tensor<4x8xf32>, tensor<2x8x16xf32>
}
