// A hand-written program for `piperc lower` (vocab-padding.test): one
// segment with four classifiers of 8 rows, of which only the first two
// (bias-free, read only by the loss kernels and the linear gradients) get
// their logits or gradient padded to a multiple of 64 columns.
piper.param @wte : tensor<16x4xf32> init normal(1.0)
piper.param @w1 : tensor<4x100xf32> init normal(1.0)
piper.param @w2 : tensor<4x100xf32> init normal(1.0)
piper.param @b2 : tensor<100xf32> init zeros(0.0)
piper.param @w3 : tensor<4x100xf32> init normal(1.0)
piper.param @w4 : tensor<4x128xf32> init normal(1.0)
piper.segment @f(%tok: tensor<2x4xi32>, %tgt: tensor<2x4xi32>) -> tensor<8x100xf32> {
  %wte = piper.param_ref @wte : tensor<16x4xf32>
  %x = piper.embedding %tok, %wte : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  // Padded: the logits, read by the fused loss only, and its gradient,
  // read by both linear gradients.
  %w1 = piper.param_ref @w1 : tensor<4x100xf32>
  %l1 = piper.linear %x, %w1 : (tensor<8x4xf32>, tensor<4x100xf32>) -> tensor<8x100xf32>
  %loss1, %d1 = piper.cross_entropy_fused %l1, %tgt : (tensor<8x100xf32>, tensor<2x4xi32>) -> (tensor<f32>, tensor<8x100xf32>)
  piper.loss_accumulate %loss1 : tensor<f32>
  %dx1 = piper.linear_grad_input %d1, %w1 : (tensor<8x100xf32>, tensor<4x100xf32>) -> tensor<8x4xf32>
  %dw1 = piper.linear_grad_weight %x, %d1 : (tensor<8x4xf32>, tensor<8x100xf32>) -> tensor<4x100xf32>
  piper.accumulate_grad @w1, %dw1 : tensor<4x100xf32>
  // Not padded: a biased linear's logits; its loss's gradient, returned.
  %w2 = piper.param_ref @w2 : tensor<4x100xf32>
  %b2 = piper.param_ref @b2 : tensor<100xf32>
  %l2 = piper.linear %x, %w2, %b2 : (tensor<8x4xf32>, tensor<4x100xf32>, tensor<100xf32>) -> tensor<8x100xf32>
  %d2 = piper.cross_entropy_grad %l2, %tgt : (tensor<8x100xf32>, tensor<2x4xi32>) -> tensor<8x100xf32>
  // Not padded: logits gelu reads too.
  %w3 = piper.param_ref @w3 : tensor<4x100xf32>
  %l3 = piper.linear %x, %w3 : (tensor<8x4xf32>, tensor<4x100xf32>) -> tensor<8x100xf32>
  %loss3 = piper.cross_entropy %l3, %tgt : (tensor<8x100xf32>, tensor<2x4xi32>) -> tensor<f32>
  %g3 = piper.gelu %l3 : tensor<8x100xf32>
  %dg3 = piper.linear_grad_weight %x, %g3 : (tensor<8x4xf32>, tensor<8x100xf32>) -> tensor<4x100xf32>
  piper.accumulate_grad @w3, %dg3 : tensor<4x100xf32>
  // Not padded: 128 columns, a multiple of 64 already.
  %w4 = piper.param_ref @w4 : tensor<4x128xf32>
  %l4 = piper.linear %x, %w4 : (tensor<8x4xf32>, tensor<4x128xf32>) -> tensor<8x128xf32>
  %loss4 = piper.cross_entropy %l4, %tgt : (tensor<8x128xf32>, tensor<2x4xi32>) -> tensor<f32>
  piper.yield %d2 : tensor<8x100xf32>
}
piper.program @train {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
  %d, %fd = piper.task @f(%tok, %tgt) {devices = #piper.group<0>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>, tensor<2x4xi32>) -> (tensor<8x100xf32>, !piper.token)
}
