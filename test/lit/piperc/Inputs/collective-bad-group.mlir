// An all-reduce of a value over [0, 1] while its producer runs on [0, 1, 2].
piper.param @wte : tensor<16x4xf32> init normal(1.0)
piper.segment @embed(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
  %w = piper.param_ref @wte : tensor<16x4xf32>
  %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  piper.yield %x : tensor<8x4xf32>
}
piper.program @train attributes {num_replicas = 3 : i64} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
  %x, %fd = piper.task @embed(%tok) {devices = #piper.group<0, 1, 2>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  %s, %sd = piper.all_reduce %x : tensor<8x4xf32> -> tensor<8x4xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 0>}
}
