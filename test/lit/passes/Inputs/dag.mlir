// The two-stage training DAG of Inputs/model.mlir (piper-stage=stages=2, then
// piper-build-training-dag): the input of the directive and schedule tests.
module {
  piper.param @wte : tensor<16x4xf32> init normal(2.000000e-02)
  piper.param @w1 : tensor<4x4xf32> init normal(2.000000e-02)
  piper.param @b1 : tensor<4xf32> init zeros(0.000000e+00)
  piper.param @lm : tensor<4x16xf32> init normal(2.000000e-02)
  piper.segment @stage0_F(%arg0: tensor<2x2xi32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) attributes {piper.pass = #piper.pass<F>} {
    %0 = piper.param_ref @wte : tensor<16x4xf32>
    %1 = piper.embedding %arg0, %0 : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
    %2 = piper.param_ref @w1 : tensor<4x4xf32>
    %3 = piper.param_ref @b1 : tensor<4xf32>
    %4 = piper.linear %1, %2, %3 : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
    %5 = piper.gelu %4 : tensor<4x4xf32>
    piper.yield %5, %4, %1 : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
  }
  piper.segment @stage1_F(%arg0: tensor<4x4xf32>, %arg1: tensor<2x2xi32>) -> tensor<4x16xf32> attributes {piper.pass = #piper.pass<F>} {
    %0 = piper.param_ref @lm : tensor<4x16xf32>
    %1 = piper.linear %arg0, %0 : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %2 = piper.cross_entropy %1, %arg1 : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
    piper.loss_accumulate %2 : tensor<f32>
    piper.yield %1 : tensor<4x16xf32>
  }
  piper.segment @stage0_B(%arg0: tensor<4x4xf32>, %arg1: tensor<4x4xf32>, %arg2: tensor<4x4xf32>, %arg3: tensor<2x2xi32>) attributes {piper.pass = #piper.pass<B>} {
    %0 = piper.gelu_grad %arg1, %arg0 : tensor<4x4xf32>
    %1 = piper.param_ref @w1 : tensor<4x4xf32>
    %2 = piper.linear_grad_input %0, %1 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %3 = piper.linear_grad_weight %arg2, %0 : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
    %4 = piper.bias_grad %0 : (tensor<4x4xf32>) -> tensor<4xf32>
    piper.accumulate_grad @b1, %4 : tensor<4xf32>
    piper.accumulate_grad @w1, %3 : tensor<4x4xf32>
    %5 = piper.embedding_grad %arg3, %2 : (tensor<2x2xi32>, tensor<4x4xf32>) -> tensor<16x4xf32>
    piper.accumulate_grad @wte, %5 : tensor<16x4xf32>
    piper.yield
  }
  piper.segment @stage1_B(%arg0: tensor<2x2xi32>, %arg1: tensor<4x16xf32>, %arg2: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {piper.pass = #piper.pass<B>} {
    %0 = piper.cross_entropy_grad %arg1, %arg0 : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<4x16xf32>
    %1 = piper.param_ref @lm : tensor<4x16xf32>
    %2 = piper.linear_grad_input %0, %1 : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x4xf32>
    %3 = piper.linear_grad_weight %arg2, %0 : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    piper.accumulate_grad @lm, %3 : tensor<4x16xf32>
    piper.yield %2 : tensor<4x4xf32>
  }
  piper.segment @stage0_U() attributes {piper.pass = #piper.pass<U>} {
    piper.adamw @b1 {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 0.000000e+00 : f64}
    piper.adamw @w1 {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-01 : f64}
    piper.adamw @wte {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-01 : f64}
    piper.zero_grad @b1
    piper.zero_grad @w1
    piper.zero_grad @wte
    piper.yield
  }
  piper.segment @stage1_U() attributes {piper.pass = #piper.pass<U>} {
    piper.adamw @lm {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-01 : f64}
    piper.zero_grad @lm
    piper.yield
  }
  piper.program @model {
    %tokens, %targets, %done = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %outs:3, %done_0 = piper.task @stage0_F(%tokens) {tag = #piper.tag<PP = 0, PASS = F>} : (tensor<2x2xi32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, !piper.token)
    %outs_1, %done_2 = piper.task @stage1_F(%outs#0, %targets) {tag = #piper.tag<PP = 1, PASS = F>} : (tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<4x16xf32>, !piper.token)
    %outs_3, %done_4 = piper.task @stage1_B(%targets, %outs_1, %outs#0) {tag = #piper.tag<PP = 1, PASS = B>} : (tensor<2x2xi32>, tensor<4x16xf32>, tensor<4x4xf32>) -> (tensor<4x4xf32>, !piper.token)
    %done_5 = piper.task @stage0_B(%outs_3, %outs#1, %outs#2, %tokens) {tag = #piper.tag<PP = 0, PASS = B>} : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<2x2xi32>) -> !piper.token
    %done_6 = piper.task @stage0_U() after(%done_5) {tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
    %done_7 = piper.task @stage1_U() after(%done_4) {tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
  }
}

