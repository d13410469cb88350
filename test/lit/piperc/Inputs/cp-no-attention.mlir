// A model without attention (an embedding and a loss): context parallelism
// has nothing to split.
module {
  piper.param @wte : tensor<32x16xf32> init normal(2.000000e-02)
  piper.segment @embed(%arg0: tensor<2x8xi32>, %arg1: tensor<2x8xi32>) -> tensor<f32> attributes {piper.block = 0 : i64} {
    %0 = piper.param_ref @wte : tensor<32x16xf32>
    %1 = piper.embedding %arg0, %0 : (tensor<2x8xi32>, tensor<32x16xf32>) -> tensor<16x16xf32>
    %2 = piper.linear %1, %0 {transpose_w} : (tensor<16x16xf32>, tensor<32x16xf32>) -> tensor<16x32xf32>
    %3 = piper.cross_entropy %2, %arg1 : (tensor<16x32xf32>, tensor<2x8xi32>) -> tensor<f32>
    piper.yield %3 : tensor<f32>
  }
  piper.program @model {
    %tokens, %targets, %done = piper.batch {tag = #piper.tag<>} : tensor<2x8xi32>, tensor<2x8xi32>
    %outs, %done_0 = piper.task @embed(%tokens, %targets) {tag = #piper.tag<block = 0>} : (tensor<2x8xi32>, tensor<2x8xi32>) -> (tensor<f32>, !piper.token)
  }
}
