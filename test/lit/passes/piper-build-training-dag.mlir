// piper-build-training-dag: reverse-mode autodiff of every stage into a
// forward (_F), a backward (_B) and an AdamW update (_U) segment and task.
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-build-training-dag | FileCheck %s
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-build-training-dag="lr=0.5 beta1=0.8 beta2=0.9 eps=1e-6 weight-decay=0.25" | FileCheck %s --check-prefix=OPT
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-build-training-dag="min-lr=1e-5 warmup-steps=10 decay-steps=100 clip-grad-norm=0.5 dtype=bf16" | FileCheck %s --check-prefix=STEP
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-build-training-dag="no-optimizer=true" | FileCheck %s --check-prefix=NO-OPT
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-build-training-dag="fuse-classifier=false" | FileCheck %s --check-prefix=NOFUSE
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-build-training-dag="fuse-epilogues=false" | FileCheck %s --check-prefix=APART
// RUN: not piper-opt %s -split-input-file -piper-build-training-dag="dtype=f16" 2>&1 | FileCheck %s --check-prefix=DTYPE
// DTYPE: for the --dtype option: Cannot find option named 'f16'!

// Two stages. The forward of stage 1 accumulates the loss and returns the
// logits' gradient (the fused classifier) instead of the loss; without the
// fusion (NOFUSE) it returns the logits, which its backward differentiates
// the loss at; the forward of stage 0
// returns its activation plus the residuals of gelu and of the embedding's
// gradient. Gradients of parameters are accumulated, input and weight
// gradients of a linear are separate ops (a biased linear's weight and bias
// gradients one op), and the backward of stage 1
// returns the gradient of its activation input for stage 0's backward.
// CHECK-LABEL: module {
// CHECK-LABEL: piper.segment @stage0_F(
// CHECK-SAME: [[IDS:%[^:]+]]: tensor<2x2xi32>) -> (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) attributes {piper.pass = #piper.pass<F>} {
// CHECK: [[EMB:%.*]] = piper.embedding [[IDS]]
// CHECK: [[LIN:%.*]] = piper.linear [[EMB]]
// CHECK: [[GELU:%.*]] = piper.gelu [[LIN]]
// CHECK: piper.yield [[GELU]], [[LIN]], [[EMB]] : tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>
// CHECK-LABEL: piper.segment @stage1_F(
// CHECK-SAME: [[X:%[^:]+]]: tensor<4x4xf32>, [[T:%[^:]+]]: tensor<2x2xi32>) -> tensor<4x16xf32> attributes {piper.pass = #piper.pass<F>} {
// CHECK: [[LOGITS:%.*]] = piper.linear [[X]]
// CHECK: [[LOSS:%[^,]+]], [[DL:%.*]] = piper.cross_entropy_fused [[LOGITS]], [[T]] : (tensor<4x16xf32>, tensor<2x2xi32>) -> (tensor<f32>, tensor<4x16xf32>)
// CHECK-NEXT: piper.loss_accumulate [[LOSS]] : tensor<f32>
// CHECK-NEXT: piper.yield [[DL]] : tensor<4x16xf32>
// NOFUSE-LABEL: piper.segment @stage1_F(
// NOFUSE-SAME: [[X:%[^:]+]]: tensor<4x4xf32>, [[T:%[^:]+]]: tensor<2x2xi32>) -> tensor<4x16xf32>
// NOFUSE: [[LOGITS:%.*]] = piper.linear [[X]]
// NOFUSE: [[LOSS:%.*]] = piper.cross_entropy [[LOGITS]], [[T]]
// NOFUSE-NEXT: piper.loss_accumulate [[LOSS]] : tensor<f32>
// NOFUSE-NEXT: piper.yield [[LOGITS]] : tensor<4x16xf32>
// CHECK-LABEL: piper.segment @stage0_B(
// CHECK-SAME: [[DY:%[^:]+]]: tensor<4x4xf32>, [[LIN:%[^:]+]]: tensor<4x4xf32>, [[EMB:%[^:]+]]: tensor<4x4xf32>, [[IDS:%[^:]+]]: tensor<2x2xi32>) attributes {piper.pass = #piper.pass<B>} {
// CHECK: [[DLIN:%.*]] = piper.gelu_grad [[LIN]], [[DY]]
// CHECK: [[W1:%.*]] = piper.param_ref @w1
// CHECK: [[DEMB:%.*]] = piper.linear_grad_input [[DLIN]], [[W1]]
// CHECK: [[DW1:%[^,]+]], [[DB1:%.*]] = piper.linear_grad_weight_bias [[EMB]], [[DLIN]] : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4xf32>)
// CHECK: piper.accumulate_grad @b1, [[DB1]] : tensor<4xf32>
// CHECK: piper.accumulate_grad @w1, [[DW1]] : tensor<4x4xf32>
// CHECK: [[DWTE:%.*]] = piper.embedding_grad [[IDS]], [[DEMB]]
// CHECK: piper.accumulate_grad @wte, [[DWTE]] : tensor<16x4xf32>
// CHECK: piper.yield{{$}}
// CHECK-LABEL: piper.segment @stage1_B(
// CHECK-SAME: [[DL:%[^:]+]]: tensor<4x16xf32>, [[X:%[^:]+]]: tensor<4x4xf32>) -> tensor<4x4xf32> attributes {piper.pass = #piper.pass<B>} {
// CHECK-NOT: cross_entropy
// CHECK: [[LM:%.*]] = piper.param_ref @lm
// CHECK: [[DX:%.*]] = piper.linear_grad_input [[DL]], [[LM]]
// CHECK: [[DLM:%.*]] = piper.linear_grad_weight [[X]], [[DL]]
// CHECK: piper.accumulate_grad @lm, [[DLM]] : tensor<4x16xf32>
// CHECK: piper.yield [[DX]] : tensor<4x4xf32>
// NOFUSE-LABEL: piper.segment @stage1_B(
// NOFUSE-SAME: [[T:%[^:]+]]: tensor<2x2xi32>, [[LOGITS:%[^:]+]]: tensor<4x16xf32>, [[X:%[^:]+]]: tensor<4x4xf32>) -> tensor<4x4xf32>
// NOFUSE: [[DL:%.*]] = piper.cross_entropy_grad [[LOGITS]], [[T]]
// NOFUSE: piper.linear_grad_input [[DL]]
// The biased linear's weight and bias gradients are one op by default
// (above); apart (APART), linear_grad_weight and bias_grad.
// APART-LABEL: piper.segment @stage0_B(
// APART-SAME: [[DY:%[^:]+]]: tensor<4x4xf32>, [[LIN:%[^:]+]]: tensor<4x4xf32>, [[EMB:%[^:]+]]: tensor<4x4xf32>
// APART-NOT: linear_grad_weight_bias
// APART: [[DLIN:%.*]] = piper.gelu_grad [[LIN]], [[DY]]
// APART: [[DW1:%.*]] = piper.linear_grad_weight [[EMB]], [[DLIN]]
// APART: [[DB1:%.*]] = piper.bias_grad [[DLIN]]
// APART: piper.accumulate_grad @b1, [[DB1]] : tensor<4xf32>
// APART: piper.accumulate_grad @w1, [[DW1]] : tensor<4x4xf32>
// APART-LABEL: piper.segment @stage1_B(
// Vectors get no weight decay; the update clears the accumulators after
// every AdamW step. (The default hyper-parameters are checked with explicit
// options below, under OPT.)
// CHECK-LABEL: piper.segment @stage0_U() attributes {piper.pass = #piper.pass<U>} {
// CHECK-NEXT: piper.adamw @b1 {beta1 = {{.*}} : f64, beta2 = {{.*}} : f64, eps = {{.*}} : f64, lr = {{.*}} : f64, weight_decay = 0.000000e+00 : f64}
// CHECK-NEXT: piper.adamw @w1 {{{.*}} weight_decay = {{[1-9].*}} : f64}
// CHECK-NEXT: piper.adamw @wte {{{.*}} weight_decay = {{[1-9].*}} : f64}
// CHECK-NEXT: piper.zero_grad @b1
// CHECK-NEXT: piper.zero_grad @w1
// CHECK-NEXT: piper.zero_grad @wte
// CHECK-NEXT: piper.yield
// CHECK-LABEL: piper.segment @stage1_U() attributes {piper.pass = #piper.pass<U>} {
// CHECK-NEXT: piper.adamw @lm
// CHECK-NEXT: piper.zero_grad @lm
// CHECK-NEXT: piper.yield
// The tasks: forwards in stage order, backwards in reverse, one update per
// stage after its backward. The step-level optimizer settings (learning-rate
// schedule, gradient clipping) are recorded on the program.
// CHECK-LABEL: piper.program @model attributes {optimizer = #piper.optimizer<{{.*}}>} {
// CHECK-NEXT: [[TOK:%[^,]+]], [[TGT:%[^,]+]], %{{.*}} = piper.batch {tag = #piper.tag<>}
// CHECK-NEXT: [[F0:%[^:]+]]:3, %{{.*}} = piper.task @stage0_F([[TOK]]) {tag = #piper.tag<PP = 0, PASS = F>}
// CHECK-NEXT: [[F1:%[^,]+]], %{{.*}} = piper.task @stage1_F([[F0]]#0, [[TGT]]) {tag = #piper.tag<PP = 1, PASS = F>}
// CHECK-NEXT: [[B1:%[^,]+]], [[B1D:%[^ ]+]] = piper.task @stage1_B([[F1]], [[F0]]#0) {tag = #piper.tag<PP = 1, PASS = B>}
// CHECK-NEXT: [[B0D:%.*]] = piper.task @stage0_B([[B1]], [[F0]]#1, [[F0]]#2, [[TOK]]) {tag = #piper.tag<PP = 0, PASS = B>}
// CHECK-NEXT: piper.task @stage0_U() after([[B0D]]) {tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
// CHECK-NEXT: piper.task @stage1_U() after([[B1D]]) {tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
// CHECK-NEXT: {{^ *}}}{{$}}

// The step-level options land in the program's optimizer settings.
// STEP-LABEL: piper.program @model attributes {optimizer = #piper.optimizer<min_lr = 1.000000e-05, warmup_steps = 10, decay_steps = 100, clip_grad_norm = 5.000000e-01, dtype = bf16>} {

// Without the optimizer there are no update segments or tasks.
// NO-OPT-NOT: piper.segment @stage0_U
// NO-OPT-LABEL: piper.program @model
// NO-OPT-NOT: PASS = U

// The optimizer options land in every adamw.
// OPT-LABEL: piper.segment @stage0_U()
// OPT-NEXT: piper.adamw @b1 {beta1 = 8.000000e-01 : f64, beta2 = 9.000000e-01 : f64, eps = 9.9999999999999995E-7 : f64, lr = 5.000000e-01 : f64, weight_decay = 0.000000e+00 : f64}
// OPT-NEXT: piper.adamw @w1 {beta1 = 8.000000e-01 : f64, beta2 = 9.000000e-01 : f64, eps = 9.9999999999999995E-7 : f64, lr = 5.000000e-01 : f64, weight_decay = 2.500000e-01 : f64}
module {
  piper.param @wte : tensor<16x4xf32> init normal(2.000000e-02)
  piper.param @w1 : tensor<4x4xf32> init normal(2.000000e-02)
  piper.param @b1 : tensor<4xf32> init zeros(0.000000e+00)
  piper.param @lm : tensor<4x16xf32> init normal(2.000000e-02)
  piper.segment @stage0(%arg0: tensor<2x2xi32>) -> tensor<4x4xf32> {
    %0 = piper.param_ref @wte : tensor<16x4xf32>
    %1 = piper.embedding %arg0, %0 : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
    %2 = piper.param_ref @w1 : tensor<4x4xf32>
    %3 = piper.param_ref @b1 : tensor<4xf32>
    %4 = piper.linear %1, %2, %3 : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
    %5 = piper.gelu %4 : tensor<4x4xf32>
    piper.yield %5 : tensor<4x4xf32>
  }
  piper.segment @stage1(%arg0: tensor<4x4xf32>, %arg1: tensor<2x2xi32>) -> tensor<f32> {
    %0 = piper.param_ref @lm : tensor<4x16xf32>
    %1 = piper.linear %arg0, %0 : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
    %2 = piper.cross_entropy %1, %arg1 : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
    piper.yield %2 : tensor<f32>
  }
  piper.program @model {
    %tokens, %targets, %done = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
    %outs, %done_0 = piper.task @stage0(%tokens) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>) -> (tensor<4x4xf32>, !piper.token)
    %outs_1, %done_2 = piper.task @stage1(%outs, %targets) {tag = #piper.tag<PP = 1>} : (tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
  }
}

// -----

// Residual connections fan gradients in with piper.add; layer_norm,
// attention and position_add have their own gradient ops.
// CHECK-LABEL: piper.segment @emb_B(
// CHECK-SAME: [[DY:%[^:]+]]: tensor<4x12xf32>, [[IDS:%[^:]+]]: tensor<2x2xi32>)
// CHECK: [[DPOS:%.*]] = piper.position_add_grad [[DY]] {seq = 2 : i64} : (tensor<4x12xf32>) -> tensor<2x12xf32>
// CHECK: [[DWTE:%.*]] = piper.embedding_grad [[IDS]], [[DY]]
// CHECK: piper.accumulate_grad @wpe, [[DPOS]]
// CHECK: piper.accumulate_grad @wte, [[DWTE]]
// CHECK-LABEL: piper.segment @s_B(
// CHECK-SAME: [[DY:%[^:]+]]: tensor<4x12xf32>, [[ATT:%[^:]+]]: tensor<4x4xf32>, [[LSE:%[^:]+]]: tensor<4x4xf32>, [[LN:%[^:]+]]: tensor<4x12xf32>, [[X:%[^:]+]]: tensor<4x12xf32>) -> tensor<4x12xf32>
// CHECK: [[W:%.*]] = piper.param_ref @w
// CHECK: [[DATT:%.*]] = piper.linear_grad_input [[DY]], [[W]]
// CHECK: [[DW:%.*]] = piper.linear_grad_weight [[ATT]], [[DY]]
// CHECK: piper.accumulate_grad @w, [[DW]]
// CHECK: [[DLN:%.*]] = piper.attention_grad [[LN]], [[ATT]], [[LSE]], [[DATT]] {heads = 2 : i64, seq = 2 : i64}
// CHECK: [[G:%.*]] = piper.param_ref @g
// CHECK: [[DX:%.*]] = piper.layer_norm_grad_input [[X]], [[G]], [[DLN]]
// CHECK: [[SUM:%.*]] = piper.add [[DY]], [[DX]] : tensor<4x12xf32>
// CHECK: [[DG:%[^,]+]], [[DB:%[^ ]+]] = piper.layer_norm_grad_weight [[X]], [[DLN]]
// CHECK: piper.accumulate_grad @b, [[DB]]
// CHECK: piper.accumulate_grad @g, [[DG]]
// CHECK: piper.yield [[SUM]] : tensor<4x12xf32>
piper.param @wte : tensor<16x12xf32> init normal(2.0e-02)
piper.param @wpe : tensor<2x12xf32> init normal(2.0e-02)
piper.param @g : tensor<12xf32> init ones(0.0)
piper.param @b : tensor<12xf32> init zeros(0.0)
piper.param @w : tensor<4x12xf32> init normal(2.0e-02)
piper.segment @emb(%ids: tensor<2x2xi32>) -> tensor<4x12xf32> {
  %wte = piper.param_ref @wte : tensor<16x12xf32>
  %wpe = piper.param_ref @wpe : tensor<2x12xf32>
  %e = piper.embedding %ids, %wte : (tensor<2x2xi32>, tensor<16x12xf32>) -> tensor<4x12xf32>
  %p = piper.position_add %e, %wpe {seq = 2 : i64} : (tensor<4x12xf32>, tensor<2x12xf32>) -> tensor<4x12xf32>
  piper.yield %p : tensor<4x12xf32>
}
piper.segment @s(%x: tensor<4x12xf32>) -> tensor<4x12xf32> {
  %g = piper.param_ref @g : tensor<12xf32>
  %b = piper.param_ref @b : tensor<12xf32>
  %ln = piper.layer_norm %x, %g, %b : (tensor<4x12xf32>, tensor<12xf32>, tensor<12xf32>) -> tensor<4x12xf32>
  %att, %att_lse = piper.attention %ln {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  %w = piper.param_ref @w : tensor<4x12xf32>
  %y = piper.linear %att, %w : (tensor<4x4xf32>, tensor<4x12xf32>) -> tensor<4x12xf32>
  %r = piper.add %x, %y : tensor<4x12xf32>
  piper.yield %r : tensor<4x12xf32>
}
piper.segment @head(%x: tensor<4x12xf32>, %t: tensor<2x2xi32>) -> tensor<f32> {
  %l = piper.cross_entropy %x, %t : (tensor<4x12xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.yield %l : tensor<f32>
}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  %e, %d0 = piper.task @emb(%tok) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>) -> (tensor<4x12xf32>, !piper.token)
  %x, %d1 = piper.task @s(%e) {tag = #piper.tag<PP = 1>} : (tensor<4x12xf32>) -> (tensor<4x12xf32>, !piper.token)
  %l, %d2 = piper.task @head(%x, %tgt) {tag = #piper.tag<PP = 2>} : (tensor<4x12xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
}

// -----

// A Llama/MoE stage: the load-balancing loss joins the step loss with its
// weight; its gradient and the router's sum into the router logits; expert
// layers, SwiGLU, dispatch/combine and RMSNorm have their gradient ops.
// CHECK-LABEL: piper.segment @moe_F(
// CHECK: [[AUX:%.*]] = piper.moe_aux_loss
// CHECK-NEXT: piper.loss_accumulate [[AUX]] {coeff = 1.000000e-02 : f64} : tensor<f32>
// CHECK: [[LOSS:%[^,]+]], [[DLOGITS:%.*]] = piper.cross_entropy_fused
// CHECK-NEXT: piper.loss_accumulate [[LOSS]] : tensor<f32>
// CHECK-LABEL: piper.segment @moe_B(
// CHECK-SAME: [[DY:%[^:]+]]: tensor<4x8xf32>
// CHECK: [[DA:%[^,]+]], [[DW:%[^ ]+]] = piper.moe_combine_grad {{.*}}, [[DY]] {capacity = 2 : i64, experts = 4 : i64}
// CHECK: [[DH:%.*]] = piper.swiglu_grad %{{.*}}, [[DA]]
// CHECK: [[DS:%.*]] = piper.expert_linear_grad_input [[DH]], %{{.*}} {experts = 4 : i64}
// CHECK: [[DE:%.*]] = piper.expert_linear_grad_weight %{{.*}}, [[DH]] {experts = 4 : i64}
// CHECK: piper.accumulate_grad @experts, [[DE]] : tensor<4x8x16xf32>
// CHECK: [[DN1:%.*]] = piper.moe_dispatch_grad %{{.*}}, [[DS]] {capacity = 2 : i64, experts = 4 : i64}
// CHECK: [[DAUX:%.*]] = piper.moe_aux_loss_grad {{.*}} {coeff = 1.000000e-02 : f64, experts = 4 : i64, top_k = 2 : i64}
// CHECK: [[DR:%.*]] = piper.moe_router_grad {{.*}}, [[DW]] {norm_topk, top_k = 2 : i64}
// CHECK: [[DL:%.*]] = piper.add [[DAUX]], [[DR]]
// CHECK: [[DN2:%.*]] = piper.linear_grad_input [[DL]]
// CHECK: [[DN:%.*]] = piper.add [[DN1]], [[DN2]]
// CHECK: piper.rms_norm_grad_input %{{.*}}, %{{.*}}, [[DN]]
// CHECK: [[DG:%.*]] = piper.rms_norm_grad_weight %{{.*}}, [[DN]]
// CHECK: piper.accumulate_grad @g, [[DG]] : tensor<8xf32>
piper.param @g : tensor<8xf32> init ones(0.0)
piper.param @wte : tensor<16x8xf32> init normal(2.0e-02)
piper.param @router : tensor<8x4xf32> init normal(2.0e-02)
piper.param @experts : tensor<4x8x16xf32> init normal(2.0e-02)
piper.segment @emb(%ids: tensor<2x2xi32>) -> tensor<4x8xf32> {
  %w = piper.param_ref @wte : tensor<16x8xf32>
  %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x8xf32>) -> tensor<4x8xf32>
  piper.yield %x : tensor<4x8xf32>
}
piper.segment @moe(%x: tensor<4x8xf32>, %t: tensor<2x2xi32>) -> tensor<f32> {
  %g = piper.param_ref @g : tensor<8xf32>
  %n = piper.rms_norm %x, %g : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %r = piper.param_ref @router : tensor<8x4xf32>
  %l = piper.linear %n, %r : (tensor<4x8xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  %idx, %wts = piper.moe_router %l {top_k = 2 : i64, norm_topk} : (tensor<4x4xf32>) -> (tensor<4x2xi32>, tensor<4x2xf32>)
  %aux = piper.moe_aux_loss %l, %idx {experts = 4 : i64, top_k = 2 : i64, coeff = 1.0e-02 : f64} : (tensor<4x4xf32>, tensor<4x2xi32>) -> tensor<f32>
  %s = piper.moe_dispatch %n, %idx {experts = 4 : i64, capacity = 2 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> tensor<8x8xf32>
  %e = piper.param_ref @experts : tensor<4x8x16xf32>
  %h = piper.expert_linear %s, %e {experts = 4 : i64} : (tensor<8x8xf32>, tensor<4x8x16xf32>) -> tensor<8x16xf32>
  %a = piper.swiglu %h : (tensor<8x16xf32>) -> tensor<8x8xf32>
  %y = piper.moe_combine %a, %idx, %wts {experts = 4 : i64, capacity = 2 : i64} : (tensor<8x8xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x8xf32>
  %loss = piper.cross_entropy %y, %t : (tensor<4x8xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.yield %loss : tensor<f32>
}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  %x, %d0 = piper.task @emb(%tok) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>) -> (tensor<4x8xf32>, !piper.token)
  %l, %d1 = piper.task @moe(%x, %tgt) {tag = #piper.tag<PP = 1>} : (tensor<4x8xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
}

// -----

// Differentiating twice: the tasks already carry a PASS.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op is already part of a training DAG}}
  %d = piper.task @s() {tag = #piper.tag<PP = 0, PASS = F>} : () -> !piper.token
}

// -----

// The model must be staged first.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op has no PP tag: run piper-stage first}}
  %d = piper.task @s() {tag = #piper.tag<block = 0>} : () -> !piper.token
}

// -----

// A program without tasks has nothing to differentiate.
// expected-error @+1 {{'piper.program' op has no tasks to differentiate}}
piper.program @p {
}

// -----

// One segment per stage task: its forward and backward are renamed.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op segment @s must be called by exactly one task}}
  %d0 = piper.task @s() {tag = #piper.tag<PP = 0>} : () -> !piper.token
  %d1 = piper.task @s() {tag = #piper.tag<PP = 1>} : () -> !piper.token
}

// -----

// A parameter used by two stages (a tied head) gets a copy, a gradient
// accumulator and an update in each (piper-tie-params later sums the gradients).
// CHECK-LABEL: piper.segment @head_B(
// CHECK: piper.accumulate_grad @wte
// CHECK: piper.segment @stage0_U()
// CHECK-NEXT: piper.adamw @wte
// CHECK: piper.segment @stage1_U()
// CHECK-NEXT: piper.adamw @wte
piper.param @wte : tensor<16x4xf32> init normal(2.0e-02)
piper.segment @embed(%ids: tensor<2x2xi32>) -> tensor<4x4xf32> {
  %w = piper.param_ref @wte : tensor<16x4xf32>
  %x = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  piper.yield %x : tensor<4x4xf32>
}
piper.segment @head(%x: tensor<4x4xf32>, %t: tensor<2x2xi32>) -> tensor<f32> {
  %w = piper.param_ref @wte : tensor<16x4xf32>
  %l = piper.linear %x, %w {transpose_w} : (tensor<4x4xf32>, tensor<16x4xf32>) -> tensor<4x16xf32>
  %loss = piper.cross_entropy %l, %t : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.yield %loss : tensor<f32>
}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  %x, %d0 = piper.task @embed(%tok) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>) -> (tensor<4x4xf32>, !piper.token)
  %l, %d1 = piper.task @head(%x, %tgt) {tag = #piper.tag<PP = 1>} : (tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
}

// -----

// An op without a gradient rule (DifferentiableOpInterface) on the gradient
// path: gradient ops have none, there are no second derivatives.
piper.segment @s(%x: tensor<4x4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{op 'piper.bias_grad' has no gradient rule}}
  %y = piper.bias_grad %x : (tensor<4x4xf32>) -> tensor<4xf32>
  piper.yield %y : tensor<4xf32>
}
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @src() -> tensor<4x4xf32> {
  %w = piper.param_ref @w : tensor<4x4xf32>
  piper.yield %w : tensor<4x4xf32>
}
piper.segment @t(%y: tensor<4xf32>) {
  piper.yield
}
piper.program @p {
  %a, %d = piper.task @src() {tag = #piper.tag<PP = 0>} : () -> (tensor<4x4xf32>, !piper.token)
  %y, %d0 = piper.task @s(%a) {tag = #piper.tag<PP = 1>} : (tensor<4x4xf32>) -> (tensor<4xf32>, !piper.token)
  %d1 = piper.task @t(%y) {tag = #piper.tag<PP = 2>} : (tensor<4xf32>) -> !piper.token
}

// -----

// A float argument that does not reach the loss receives no gradient.
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @src() -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  %w = piper.param_ref @w : tensor<4x4xf32>
  piper.yield %w, %w : tensor<4x4xf32>, tensor<4x4xf32>
}
// expected-error @+1 {{'piper.segment' op argument #1 receives no gradient}}
piper.segment @head(%x: tensor<4x4xf32>, %unused: tensor<4x4xf32>, %t: tensor<2x2xi32>) -> tensor<f32> {
  %l = piper.cross_entropy %x, %t : (tensor<4x4xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.yield %l : tensor<f32>
}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  %a, %b, %d0 = piper.task @src() {tag = #piper.tag<PP = 0>} : () -> (tensor<4x4xf32>, tensor<4x4xf32>, !piper.token)
  %l, %d1 = piper.task @head(%a, %b, %tgt) {tag = #piper.tag<PP = 1>} : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
}

// -----

// A float result that no later stage consumes (and that is not a loss)
// gets no gradient.
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @last() -> tensor<4x4xf32> {
  %w = piper.param_ref @w : tensor<4x4xf32>
  %g = piper.gelu %w : tensor<4x4xf32>
  piper.yield %g : tensor<4x4xf32>
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op result #0 is not consumed by a later stage, so it gets no gradient}}
  %x, %d = piper.task @last() {tag = #piper.tag<PP = 0>} : () -> (tensor<4x4xf32>, !piper.token)
}

// -----

// A value feeding two stages would need its gradients summed across stages.
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @src() -> tensor<4x4xf32> {
  %w = piper.param_ref @w : tensor<4x4xf32>
  piper.yield %w : tensor<4x4xf32>
}
piper.segment @mid(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {
  %g = piper.gelu %x : tensor<4x4xf32>
  piper.yield %g : tensor<4x4xf32>
}
piper.segment @head(%x: tensor<4x4xf32>, %y: tensor<4x4xf32>, %t: tensor<2x2xi32>) -> tensor<f32> {
  %s = piper.add %x, %y : tensor<4x4xf32>
  %l = piper.cross_entropy %s, %t : (tensor<4x4xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.yield %l : tensor<f32>
}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  %a, %d0 = piper.task @src() {tag = #piper.tag<PP = 0>} : () -> (tensor<4x4xf32>, !piper.token)
  // expected-error @+1 {{'piper.task' op a value feeding several stages is not supported yet}}
  %b, %d1 = piper.task @mid(%a) {tag = #piper.tag<PP = 1>} : (tensor<4x4xf32>) -> (tensor<4x4xf32>, !piper.token)
  %l, %d2 = piper.task @head(%a, %b, %tgt) {tag = #piper.tag<PP = 2>} : (tensor<4x4xf32>, tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
}

// -----

// The fused classifier is not used where the backward re-runs the logits'
// op (a recompute region): the forward keeps the region's input, and the
// backward recomputes the logits and differentiates the loss there.
// CHECK-LABEL: piper.segment @head_F(
// CHECK-NOT: cross_entropy_fused
// CHECK: [[LOSS:%.*]] = piper.cross_entropy %{{.*}}, %{{.*}} :
// CHECK-NEXT: piper.loss_accumulate [[LOSS]] : tensor<f32>
// CHECK-NEXT: piper.yield %{{.*}} : tensor<4x4xf32>
// CHECK-LABEL: piper.segment @head_B(
// CHECK: [[LOGITS:%.*]] = piper.linear
// CHECK: piper.cross_entropy_grad [[LOGITS]],
piper.param @wte : tensor<16x4xf32> init normal(2.0e-02)
piper.param @lm : tensor<4x16xf32> init normal(2.0e-02)
piper.segment @head(%ids: tensor<2x2xi32>, %t: tensor<2x2xi32>) -> tensor<f32> {
  %e = piper.param_ref @wte : tensor<16x4xf32>
  %x = piper.embedding %ids, %e : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  %h = piper.gelu %x {piper.recompute = 1 : i64} : tensor<4x4xf32>
  %w = piper.param_ref @lm : tensor<4x16xf32>
  %l = piper.linear %h, %w {piper.recompute = 1 : i64} : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  %loss = piper.cross_entropy %l, %t : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.yield %loss : tensor<f32>
}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  %l, %d0 = piper.task @head(%tok, %tgt) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
}
