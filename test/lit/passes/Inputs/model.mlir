// A three-block forward model (embed, block0, head) as `piperc model` emits
// it, small enough to read: the input of the staging and strategy tests.
module {
  piper.param @wte : tensor<16x4xf32> init normal(2.000000e-02)
  piper.param @w1 : tensor<4x4xf32> init normal(2.000000e-02)
  piper.param @b1 : tensor<4xf32> init zeros(0.000000e+00)
  piper.param @lm : tensor<4x16xf32> init normal(2.000000e-02)
  piper.segment @embed(%ids: tensor<2x2xi32>) -> tensor<4x4xf32> attributes {piper.block = 0 : i64} {
    %w = piper.param_ref @wte : tensor<16x4xf32>
    %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
    piper.yield %x : tensor<4x4xf32>
  }
  piper.segment @block0(%x: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {piper.block = 1 : i64} {
    %w = piper.param_ref @w1 : tensor<4x4xf32>
    %b = piper.param_ref @b1 : tensor<4xf32>
    %y = piper.linear %x, %w, %b : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
    %g = piper.gelu %y : tensor<4x4xf32>
    piper.yield %g : tensor<4x4xf32>
  }
  piper.segment @head(%x: tensor<4x4xf32>, %t: tensor<2x2xi32>) -> tensor<f32> attributes {piper.block = 2 : i64} {
    %w = piper.param_ref @lm : tensor<4x16xf32>
    %l = piper.linear %x, %w : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %loss = piper.cross_entropy %l, %t : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
    piper.yield %loss : tensor<f32>
  }
  piper.program @model {
    %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %x, %d0 = piper.task @embed(%tok) {tag = #piper.tag<block = 0>} : (tensor<2x2xi32>) -> (tensor<4x4xf32>, !piper.token)
    %y, %d1 = piper.task @block0(%x) {tag = #piper.tag<block = 1>} : (tensor<4x4xf32>) -> (tensor<4x4xf32>, !piper.token)
    %l, %d2 = piper.task @head(%y, %tgt) {tag = #piper.tag<block = 2>} : (tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
  }
}
