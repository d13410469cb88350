// RUN: piper-opt %s -test-print-cost -o /dev/null | FileCheck %s

// A linear layer costs 2·N·K·M FLOPs, attention 4·N·H·seq, an elementwise op
// one per output element; bytes count every tensor operand and result once.
// CHECK: segment @mlp: flops 544, bytes 768
piper.segment @mlp(%x: tensor<4x8xf32>, %w: tensor<8x8xf32>) -> tensor<4x8xf32> {
  %y = piper.linear %x, %w : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %z = piper.gelu %y : tensor<4x8xf32>
  piper.yield %z : tensor<4x8xf32>
}

// CHECK: segment @attn: flops 256, bytes 512
piper.segment @attn(%qkv: tensor<4x24xf32>) -> tensor<4x8xf32> {
  %a = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64} : (tensor<4x24xf32>) -> tensor<4x8xf32>
  piper.yield %a : tensor<4x8xf32>
}
