// A hand-written program for `piperc lower`: three data-parallel ranks each
// embed their own microbatch (x_r, 8 rows) and sum the x_r three ways:
//   @a accumulates all_reduce(x),
//   @b accumulates all_gather(reduce_scatter(x)) (uneven slices 3, 3, 2),
//   @c accumulates x itself,
// then the gradient form of all_reduce (data parallelism) sums @a, @b, @c
// over the ranks. So grad(@a) = grad(@b) = 3 * grad(@c) = 3 * sum_r x_r.
piper.param @wte : tensor<16x4xf32> init normal(1.0)
piper.param @a : tensor<8x4xf32> init zeros(0.0)
piper.param @b : tensor<8x4xf32> init zeros(0.0)
piper.param @c : tensor<8x4xf32> init zeros(0.0)
piper.segment @embed(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
  %w = piper.param_ref @wte : tensor<16x4xf32>
  %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
  piper.yield %x : tensor<8x4xf32>
}
piper.segment @acc_a(%g: tensor<8x4xf32>) {
  piper.accumulate_grad @a, %g : tensor<8x4xf32>
  piper.yield
}
piper.segment @acc_b(%g: tensor<8x4xf32>) {
  piper.accumulate_grad @b, %g : tensor<8x4xf32>
  piper.yield
}
piper.segment @acc_c(%g: tensor<8x4xf32>) {
  piper.accumulate_grad @c, %g : tensor<8x4xf32>
  piper.yield
}
piper.program @train attributes {num_replicas = 3 : i64} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
  %x, %fd = piper.task @embed(%tok) {devices = #piper.group<0, 1, 2>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  %s, %sd = piper.all_reduce %x : tensor<8x4xf32> -> tensor<8x4xf32> {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 0>}
  %sh, %rd = piper.reduce_scatter %x {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 0>} : tensor<8x4xf32> -> tensor<3x4xf32>
  %full, %gd = piper.all_gather %sh {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"gather_stream", comm>, tag = #piper.tag<PP = 0, MB = 0>} : tensor<3x4xf32> -> tensor<8x4xf32>
  %t1 = piper.task @acc_a(%s) {devices = #piper.group<0, 1, 2>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<8x4xf32>) -> !piper.token
  %t2 = piper.task @acc_b(%full) {devices = #piper.group<0, 1, 2>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<8x4xf32>) -> !piper.token
  %t3 = piper.task @acc_c(%x) {devices = #piper.group<0, 1, 2>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<8x4xf32>) -> !piper.token
  %ar = piper.all_reduce grads [@a, @b, @c] after(%t1, %t2, %t3) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
}
