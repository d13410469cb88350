// A hand-written program for `piperc lower`: four data-parallel ranks each
// embed their own microbatch x_r (8 rows) and run collectives over
// subgroups of the class, the layout of expert parallelism (Megatron,
// DeepSpeed-MoE): expert groups of consecutive ranks {0, 1}, {2, 3}, and
// the ranks holding the same experts, strided {0, 2}, {1, 3}.
//   @a accumulates all_reduce_{0,2|1,3}(all_reduce_{0,1|2,3}(x)): the sum
//      over all four ranks, so grad(@a) = 4 * sum_r x_r after the
//      data-parallel sum;
//   @b accumulates all_gather_{0,1|2,3}(reduce_scatter_{0,1|2,3}(x)): the
//      pair sums x_0 + x_1 on ranks 0, 1 and x_2 + x_3 on ranks 2, 3, so
//      grad(@b) = 2 * sum_r x_r (4 * sum_r x_r if the subgroups were
//      ignored);
//   @c accumulates x itself: grad(@c) = sum_r x_r.
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
piper.program @train attributes {num_replicas = 4 : i64} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
  %x, %fd = piper.task @embed(%tok) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  %p, %pd = piper.all_reduce %x : tensor<8x4xf32> -> tensor<8x4xf32> {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"ep_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0, MB = 0>}
  %s, %sd = piper.all_reduce %p : tensor<8x4xf32> -> tensor<8x4xf32> {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"ep_stream", comm>, subgroups = [#piper.group<0, 2>, #piper.group<1, 3>], tag = #piper.tag<PP = 0, MB = 0>}
  %sh, %rd = piper.reduce_scatter %x {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0, MB = 0>} : tensor<8x4xf32> -> tensor<4x4xf32>
  %full, %gd = piper.all_gather %sh {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0, MB = 0>} : tensor<4x4xf32> -> tensor<8x4xf32>
  %t1 = piper.task @acc_a(%s) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<8x4xf32>) -> !piper.token
  %t2 = piper.task @acc_b(%full) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<8x4xf32>) -> !piper.token
  %t3 = piper.task @acc_c(%x) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : (tensor<8x4xf32>) -> !piper.token
  %ar = piper.all_reduce grads [@a, @b, @c] after(%t1, %t2, %t3) {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
}
