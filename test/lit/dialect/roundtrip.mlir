// Every op, type and attribute of the piper dialect survives print -> parse,
// in the custom and in the generic form.
// RUN: piper-opt %s | piper-opt | FileCheck %s
// RUN: piper-opt %s -mlir-print-op-generic | piper-opt | FileCheck %s

// Parameters with each initializer kind; the scale prints as an f64.
// CHECK-LABEL: piper.param @wte : tensor<16x4xf32> init normal(2.000000e-02)
// CHECK: piper.param @wpe : tensor<2x4xf32> init normal(1.000000e-02)
// CHECK: piper.param @ln.g : tensor<4xf32> init ones(0.000000e+00)
// CHECK: piper.param @ln.b : tensor<4xf32> init zeros(0.000000e+00)
// CHECK: piper.param @qkv.w : tensor<4x12xf32> init normal(2.000000e-02)
// CHECK: piper.param @qkv.b : tensor<12xf32> init zeros(0.000000e+00)
piper.param @wte : tensor<16x4xf32> init normal(2.0e-02)
piper.param @wpe : tensor<2x4xf32> init normal(1.0e-02)
piper.param @ln.g : tensor<4xf32> init ones(0.0)
piper.param @ln.b : tensor<4xf32> init zeros(0.0)
piper.param @qkv.w : tensor<4x12xf32> init normal(2.0e-02)
piper.param @qkv.b : tensor<12xf32> init zeros(0.0)

// Forward compute: every op, linear with and without bias and transposed.
// CHECK-LABEL: piper.segment @forward(
// CHECK-SAME: [[IDS:%[^:]+]]: tensor<2x2xi32>, [[TGT:%[^:]+]]: tensor<2x2xi32>)
// CHECK-SAME: -> (tensor<f32>, tensor<4x16xf32>) attributes {piper.block = 0 : i64, piper.pass = #piper.pass<F>}
// CHECK: [[WTE:%.*]] = piper.param_ref @wte : tensor<16x4xf32>
// CHECK: [[WPE:%.*]] = piper.param_ref @wpe : tensor<2x4xf32>
// CHECK: [[EMB:%.*]] = piper.embedding [[IDS]], [[WTE]] : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
// CHECK: [[POS:%.*]] = piper.position_add [[EMB]], [[WPE]] {seq = 2 : i64} : (tensor<4x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
// CHECK: [[G:%.*]] = piper.param_ref @ln.g
// CHECK: [[B:%.*]] = piper.param_ref @ln.b
// CHECK: [[LN:%.*]] = piper.layer_norm [[POS]], [[G]], [[B]] : (tensor<4x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
// CHECK: [[LN2:%.*]] = piper.layer_norm [[POS]], [[G]], [[B]] {eps = 1.000000e-03 : f64} : (tensor<4x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
// CHECK: [[QW:%.*]] = piper.param_ref @qkv.w
// CHECK: [[QB:%.*]] = piper.param_ref @qkv.b
// CHECK: [[QKV:%.*]] = piper.linear [[LN]], [[QW]], [[QB]] : (tensor<4x4xf32>, tensor<4x12xf32>, tensor<12xf32>) -> tensor<4x12xf32>
// CHECK: [[ATT:%.*]], {{%.*}} = piper.attention [[QKV]] {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
// CHECK: [[GELU:%.*]] = piper.gelu [[ATT]] : tensor<4x4xf32>
// CHECK: [[SUM:%.*]] = piper.add [[GELU]], [[LN2]] : tensor<4x4xf32>
// CHECK: [[NOB:%.*]] = piper.linear [[SUM]], %{{.*}} : (tensor<4x4xf32>, tensor<4x12xf32>) -> tensor<4x12xf32>
// CHECK: [[LOGITS:%.*]] = piper.linear [[SUM]], [[WTE]] {transpose_w} : (tensor<4x4xf32>, tensor<16x4xf32>) -> tensor<4x16xf32>
// CHECK: [[LOSS:%.*]] = piper.cross_entropy [[LOGITS]], [[TGT]] : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
// CHECK: piper.loss_accumulate [[LOSS]] : tensor<f32>
// CHECK: piper.yield [[LOSS]], [[LOGITS]] : tensor<f32>, tensor<4x16xf32>
piper.segment @forward(%ids: tensor<2x2xi32>, %tgt: tensor<2x2xi32>) -> (tensor<f32>, tensor<4x16xf32>)
    attributes {piper.block = 0 : i64, piper.pass = #piper.pass<F>} {
  %wte = piper.param_ref @wte : tensor<16x4xf32>
  %wpe = piper.param_ref @wpe : tensor<2x4xf32>
  %emb = piper.embedding %ids, %wte : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  %pos = piper.position_add %emb, %wpe {seq = 2 : i64} : (tensor<4x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  %g = piper.param_ref @ln.g : tensor<4xf32>
  %b = piper.param_ref @ln.b : tensor<4xf32>
  %ln = piper.layer_norm %pos, %g, %b : (tensor<4x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
  %ln2 = piper.layer_norm %pos, %g, %b {eps = 1.0e-03 : f64} : (tensor<4x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
  %qw = piper.param_ref @qkv.w : tensor<4x12xf32>
  %qb = piper.param_ref @qkv.b : tensor<12xf32>
  %qkv = piper.linear %ln, %qw, %qb : (tensor<4x4xf32>, tensor<4x12xf32>, tensor<12xf32>) -> tensor<4x12xf32>
  %att, %att_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  %gelu = piper.gelu %att : tensor<4x4xf32>
  %sum = piper.add %gelu, %ln2 : tensor<4x4xf32>
  %nob = piper.linear %sum, %qw : (tensor<4x4xf32>, tensor<4x12xf32>) -> tensor<4x12xf32>
  %logits = piper.linear %sum, %wte {transpose_w} : (tensor<4x4xf32>, tensor<16x4xf32>) -> tensor<4x16xf32>
  %loss = piper.cross_entropy %logits, %tgt : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<f32>
  piper.loss_accumulate %loss : tensor<f32>
  piper.yield %loss, %logits : tensor<f32>, tensor<4x16xf32>
}

// Gradient ops and gradient accumulation; layer norm's input and weight
// gradients (the BI and BW halves of its backward) are separate ops.
// CHECK-LABEL: piper.segment @backward(
// CHECK-SAME: [[IDS:%[^:]+]]: tensor<2x2xi32>, [[X:%[^:]+]]: tensor<4x4xf32>, [[QKV:%[^:]+]]: tensor<4x12xf32>, [[DY:%[^:]+]]: tensor<4x4xf32>, [[LOGITS:%[^:]+]]: tensor<4x16xf32>)
// CHECK-SAME: -> tensor<4x4xf32>
// CHECK: [[DL:%.*]] = piper.cross_entropy_grad [[LOGITS]], [[IDS]] : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<4x16xf32>
// CHECK: [[WTE:%.*]] = piper.param_ref @wte
// CHECK: [[DX0:%.*]] = piper.linear_grad_input [[DL]], [[WTE]] {transpose_w} : (tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<4x4xf32>
// CHECK: [[DW0:%.*]] = piper.linear_grad_weight [[X]], [[DL]] {transpose_w} : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<16x4xf32>
// CHECK: [[DGELU:%.*]] = piper.gelu_grad [[X]], [[DY]] : tensor<4x4xf32>
// CHECK: [[DQKV:%.*]] = piper.attention_grad [[QKV]], [[X]], [[X]], [[DGELU]] {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x12xf32>
// CHECK: [[QW:%.*]] = piper.param_ref @qkv.w
// CHECK: [[DLN:%.*]] = piper.linear_grad_input [[DQKV]], [[QW]] : (tensor<4x12xf32>, tensor<4x12xf32>) -> tensor<4x4xf32>
// CHECK: [[DQW:%.*]] = piper.linear_grad_weight [[X]], [[DQKV]] : (tensor<4x4xf32>, tensor<4x12xf32>) -> tensor<4x12xf32>
// CHECK: [[DQB:%.*]] = piper.bias_grad [[DQKV]] : (tensor<4x12xf32>) -> tensor<12xf32>
// CHECK: [[DQW2:%[^,]+]], [[DQB2:%.*]] = piper.linear_grad_weight_bias [[X]], [[DQKV]] : (tensor<4x4xf32>, tensor<4x12xf32>) -> (tensor<4x12xf32>, tensor<12xf32>)
// CHECK: piper.linear_grad_weight_bias [[X]], [[DL]] {transpose_w} : (tensor<4x4xf32>, tensor<4x16xf32>) -> (tensor<16x4xf32>, tensor<16xf32>)
// CHECK: [[G:%.*]] = piper.param_ref @ln.g
// CHECK: [[DX:%.*]] = piper.layer_norm_grad_input [[X]], [[G]], [[DLN]] : (tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: [[DG:%[^,]+]], [[DB:%[^ ]+]] = piper.layer_norm_grad_weight [[X]], [[DLN]] : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
// CHECK: piper.layer_norm_grad_input [[X]], [[G]], [[DLN]] {eps = 1.000000e-03 : f64} : (tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
// CHECK: piper.layer_norm_grad_weight [[X]], [[DLN]] {eps = 1.000000e-03 : f64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
// CHECK: [[DPOS:%.*]] = piper.position_add_grad [[DX]] {seq = 2 : i64} : (tensor<4x4xf32>) -> tensor<2x4xf32>
// CHECK: [[DWTE:%.*]] = piper.embedding_grad [[IDS]], [[DX]] : (tensor<2x2xi32>, tensor<4x4xf32>) -> tensor<16x4xf32>
// CHECK: [[DSUM:%.*]] = piper.add [[DWTE]], [[DW0]] : tensor<16x4xf32>
// CHECK: piper.accumulate_grad @wte, [[DSUM]] : tensor<16x4xf32>
// CHECK: piper.accumulate_grad @wpe, [[DPOS]] : tensor<2x4xf32>
// CHECK: piper.accumulate_grad @qkv.w, [[DQW]] : tensor<4x12xf32>
// CHECK: piper.accumulate_grad @qkv.b, [[DQB]] : tensor<12xf32>
// CHECK: piper.accumulate_grad @ln.g, [[DG]] : tensor<4xf32>
// CHECK: piper.accumulate_grad @ln.b, [[DB]] : tensor<4xf32>
// CHECK: piper.yield [[DX0]] : tensor<4x4xf32>
piper.segment @backward(%ids: tensor<2x2xi32>, %x: tensor<4x4xf32>, %qkv: tensor<4x12xf32>,
                        %dy: tensor<4x4xf32>, %logits: tensor<4x16xf32>) -> tensor<4x4xf32> {
  %dl = piper.cross_entropy_grad %logits, %ids : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<4x16xf32>
  %wte = piper.param_ref @wte : tensor<16x4xf32>
  %dx0 = piper.linear_grad_input %dl, %wte {transpose_w} : (tensor<4x16xf32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  %dw0 = piper.linear_grad_weight %x, %dl {transpose_w} : (tensor<4x4xf32>, tensor<4x16xf32>) -> tensor<16x4xf32>
  %dgelu = piper.gelu_grad %x, %dy : tensor<4x4xf32>
  %dqkv = piper.attention_grad %qkv, %x, %x, %dgelu {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>, tensor<4x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x12xf32>
  %qw = piper.param_ref @qkv.w : tensor<4x12xf32>
  %dln = piper.linear_grad_input %dqkv, %qw : (tensor<4x12xf32>, tensor<4x12xf32>) -> tensor<4x4xf32>
  %dqw = piper.linear_grad_weight %x, %dqkv : (tensor<4x4xf32>, tensor<4x12xf32>) -> tensor<4x12xf32>
  %dqb = piper.bias_grad %dqkv : (tensor<4x12xf32>) -> tensor<12xf32>
  %dqw2, %dqb2 = piper.linear_grad_weight_bias %x, %dqkv : (tensor<4x4xf32>, tensor<4x12xf32>) -> (tensor<4x12xf32>, tensor<12xf32>)
  %dw3, %db3 = piper.linear_grad_weight_bias %x, %dl {transpose_w} : (tensor<4x4xf32>, tensor<4x16xf32>) -> (tensor<16x4xf32>, tensor<16xf32>)
  %g = piper.param_ref @ln.g : tensor<4xf32>
  %dx = piper.layer_norm_grad_input %x, %g, %dln : (tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %dg, %db = piper.layer_norm_grad_weight %x, %dln : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  %lni = piper.layer_norm_grad_input %x, %g, %dln {eps = 1.0e-03 : f64} : (tensor<4x4xf32>, tensor<4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %lnw:2 = piper.layer_norm_grad_weight %x, %dln {eps = 1.0e-03 : f64} : (tensor<4x4xf32>, tensor<4x4xf32>) -> (tensor<4xf32>, tensor<4xf32>)
  %dpos = piper.position_add_grad %dx {seq = 2 : i64} : (tensor<4x4xf32>) -> tensor<2x4xf32>
  %dwte = piper.embedding_grad %ids, %dx : (tensor<2x2xi32>, tensor<4x4xf32>) -> tensor<16x4xf32>
  %dsum = piper.add %dwte, %dw0 : tensor<16x4xf32>
  piper.accumulate_grad @wte, %dsum : tensor<16x4xf32>
  piper.accumulate_grad @wpe, %dpos : tensor<2x4xf32>
  piper.accumulate_grad @qkv.w, %dqw : tensor<4x12xf32>
  piper.accumulate_grad @qkv.b, %dqb : tensor<12xf32>
  piper.accumulate_grad @ln.g, %dg : tensor<4xf32>
  piper.accumulate_grad @ln.b, %db : tensor<4xf32>
  piper.yield %dx0 : tensor<4x4xf32>
}

// Llama blocks: RMSNorm (default and explicit eps), grouped-query attention
// with rotary embeddings, SwiGLU, and their gradients (RMSNorm's also split
// into input and weight halves).
// CHECK-LABEL: piper.param @g : tensor<8xf32> init ones(0.000000e+00)
// CHECK-LABEL: piper.segment @llama(
// CHECK-SAME: [[QKV:%[^:]+]]: tensor<4x16xf32>, [[X:%[^:]+]]: tensor<4x8xf32>, [[DY:%[^:]+]]: tensor<4x8xf32>, [[GU:%[^:]+]]: tensor<4x12xf32>, [[DZ:%[^:]+]]: tensor<4x6xf32>)
// CHECK: [[G:%.*]] = piper.param_ref @g : tensor<8xf32>
// CHECK: piper.rms_norm [[X]], [[G]] : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
// CHECK: piper.rms_norm [[X]], [[G]] {eps = 1.000000e-05 : f64} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
// CHECK: piper.rms_norm_grad_input [[X]], [[G]], [[DY]] {eps = 1.000000e-05 : f64} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
// CHECK: [[DG:%.*]] = piper.rms_norm_grad_weight [[X]], [[DY]] : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8xf32>
// CHECK: [[ATT:%.*]], [[LSE:%.*]] = piper.attention [[QKV]] {heads = 4 : i64, kv_heads = 2 : i64, rope_theta = 1.000000e+04 : f64, seq = 2 : i64} : (tensor<4x16xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
// CHECK: piper.attention_grad [[QKV]], [[ATT]], [[LSE]], [[DY]] {heads = 4 : i64, kv_heads = 2 : i64, rope_theta = 1.000000e+04 : f64, seq = 2 : i64} : (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
// CHECK: piper.swiglu [[GU]] : (tensor<4x12xf32>) -> tensor<4x6xf32>
// CHECK: piper.swiglu_grad [[GU]], [[DZ]] : (tensor<4x12xf32>, tensor<4x6xf32>) -> tensor<4x12xf32>
// CHECK: piper.accumulate_grad @g, [[DG]] : tensor<8xf32>
// CHECK: piper.yield [[ATT]] : tensor<4x8xf32>
piper.param @g : tensor<8xf32> init ones(0.0)
piper.param @experts.w : tensor<4x8x6xf32> init normal(2.0e-02)
piper.segment @llama(%qkv: tensor<4x16xf32>, %x: tensor<4x8xf32>, %dy: tensor<4x8xf32>, %gu: tensor<4x12xf32>, %dz: tensor<4x6xf32>) -> tensor<4x8xf32> {
  %g = piper.param_ref @g : tensor<8xf32>
  %rms = piper.rms_norm %x, %g : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %rms2 = piper.rms_norm %x, %g {eps = 1.0e-05 : f64} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %rgi = piper.rms_norm_grad_input %x, %g, %dy {eps = 1.0e-05 : f64} : (tensor<4x8xf32>, tensor<8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %dg = piper.rms_norm_grad_weight %x, %dy : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<8xf32>
  %att, %att_lse = piper.attention %qkv {heads = 4 : i64, kv_heads = 2 : i64, seq = 2 : i64, rope_theta = 1.0e+04 : f64} : (tensor<4x16xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
  %datt = piper.attention_grad %qkv, %att, %att_lse, %dy {heads = 4 : i64, kv_heads = 2 : i64, seq = 2 : i64, rope_theta = 1.0e+04 : f64} : (tensor<4x16xf32>, tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x16xf32>
  %z = piper.swiglu %gu : (tensor<4x12xf32>) -> tensor<4x6xf32>
  %dgu = piper.swiglu_grad %gu, %dz : (tensor<4x12xf32>, tensor<4x6xf32>) -> tensor<4x12xf32>
  piper.accumulate_grad @g, %dg : tensor<8xf32>
  piper.yield %att : tensor<4x8xf32>
}

// Qwen3's q/k norm over q|k|v (4 query heads, 2 key/value heads of 2)
// and its two gradient halves; eps printed only when not the default.
// CHECK-LABEL: piper.segment @qwen3(
// CHECK-SAME: [[QKV:%[^:]+]]: tensor<4x16xf32>, [[G:%[^:]+]]: tensor<4xf32>, [[DY:%[^:]+]]: tensor<4x16xf32>)
// CHECK: piper.qk_norm [[QKV]], [[G]] {heads = 4 : i64, kv_heads = 2 : i64} : (tensor<4x16xf32>, tensor<4xf32>) -> tensor<4x16xf32>
// CHECK: piper.qk_norm_grad_input [[QKV]], [[G]], [[DY]] {eps = 1.000000e-05 : f64, heads = 4 : i64, kv_heads = 2 : i64} : (tensor<4x16xf32>, tensor<4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
// CHECK: piper.qk_norm_grad_weight [[QKV]], [[DY]] {heads = 4 : i64, kv_heads = 2 : i64} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4xf32>
piper.segment @qwen3(%qkv: tensor<4x16xf32>, %g: tensor<4xf32>, %dy: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %y = piper.qk_norm %qkv, %g {heads = 4 : i64, kv_heads = 2 : i64} : (tensor<4x16xf32>, tensor<4xf32>) -> tensor<4x16xf32>
  %dx = piper.qk_norm_grad_input %qkv, %g, %dy {heads = 4 : i64, kv_heads = 2 : i64, eps = 1.0e-05 : f64} : (tensor<4x16xf32>, tensor<4xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  %dg = piper.qk_norm_grad_weight %qkv, %dy {heads = 4 : i64, kv_heads = 2 : i64} : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4xf32>
  piper.yield %y : tensor<4x16xf32>
}

// Mixture of experts: routing (with and without renormalized top-k),
// dispatch into expert slots, per-expert linear layers, combine, the
// load-balancing loss with its weight, and every gradient.
// CHECK-LABEL: piper.segment @moe(
// CHECK-SAME: [[X:%[^:]+]]: tensor<4x8xf32>, [[LOGITS:%[^:]+]]: tensor<4x4xf32>, [[DY:%[^:]+]]: tensor<4x8xf32>, [[DW:%[^:]+]]: tensor<4x2xf32>, [[DSLOTS:%[^:]+]]: tensor<8x6xf32>)
// CHECK: [[IDX:%[^,]+]], [[WTS:%[^ ]+]] = piper.moe_router [[LOGITS]] {norm_topk, top_k = 2 : i64} : (tensor<4x4xf32>) -> (tensor<4x2xi32>, tensor<4x2xf32>)
// CHECK: piper.moe_router [[LOGITS]] {top_k = 1 : i64} : (tensor<4x4xf32>) -> (tensor<4x1xi32>, tensor<4x1xf32>)
// CHECK: piper.moe_router_grad [[LOGITS]], [[IDX]], [[DW]] {norm_topk, top_k = 2 : i64} : (tensor<4x4xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x4xf32>
// CHECK: [[SLOTS:%.*]] = piper.moe_dispatch [[X]], [[IDX]] {capacity = 2 : i64, experts = 4 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> tensor<8x8xf32>
// CHECK: piper.moe_dispatch_grad [[IDX]], [[SLOTS]] {capacity = 2 : i64, experts = 4 : i64} : (tensor<4x2xi32>, tensor<8x8xf32>) -> tensor<4x8xf32>
// CHECK: [[W:%.*]] = piper.param_ref @experts.w : tensor<4x8x6xf32>
// CHECK: [[H:%.*]] = piper.expert_linear [[SLOTS]], [[W]] {experts = 4 : i64} : (tensor<8x8xf32>, tensor<4x8x6xf32>) -> tensor<8x6xf32>
// CHECK: piper.expert_linear_grad_input [[DSLOTS]], [[W]] {experts = 4 : i64} : (tensor<8x6xf32>, tensor<4x8x6xf32>) -> tensor<8x8xf32>
// CHECK: [[DEW:%.*]] = piper.expert_linear_grad_weight [[SLOTS]], [[DSLOTS]] {experts = 4 : i64} : (tensor<8x8xf32>, tensor<8x6xf32>) -> tensor<4x8x6xf32>
// CHECK: piper.accumulate_grad @experts.w, [[DEW]] : tensor<4x8x6xf32>
// CHECK: [[Y:%.*]] = piper.moe_combine [[H]], [[IDX]], [[WTS]] {capacity = 2 : i64, experts = 4 : i64} : (tensor<8x6xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x6xf32>
// CHECK: piper.moe_combine_grad [[H]], [[IDX]], [[WTS]], [[Y]] {capacity = 2 : i64, experts = 4 : i64} : (tensor<8x6xf32>, tensor<4x2xi32>, tensor<4x2xf32>, tensor<4x6xf32>) -> (tensor<8x6xf32>, tensor<4x2xf32>)
// CHECK: [[AUX:%.*]] = piper.moe_aux_loss [[LOGITS]], [[IDX]] {coeff = 1.000000e-02 : f64, experts = 4 : i64, top_k = 2 : i64} : (tensor<4x4xf32>, tensor<4x2xi32>) -> tensor<f32>
// CHECK: piper.loss_accumulate [[AUX]] {coeff = 1.000000e-02 : f64} : tensor<f32>
// CHECK: piper.moe_aux_loss_grad [[LOGITS]], [[IDX]] {coeff = 1.000000e-02 : f64, experts = 4 : i64, top_k = 2 : i64} : (tensor<4x4xf32>, tensor<4x2xi32>) -> tensor<4x4xf32>
// CHECK: piper.yield [[Y]] : tensor<4x6xf32>
piper.segment @moe(%x: tensor<4x8xf32>, %logits: tensor<4x4xf32>, %dy: tensor<4x8xf32>, %dw: tensor<4x2xf32>, %dslots: tensor<8x6xf32>) -> tensor<4x6xf32> {
  %idx, %wts = piper.moe_router %logits {top_k = 2 : i64, norm_topk} : (tensor<4x4xf32>) -> (tensor<4x2xi32>, tensor<4x2xf32>)
  %idx2, %wts2 = piper.moe_router %logits {top_k = 1 : i64} : (tensor<4x4xf32>) -> (tensor<4x1xi32>, tensor<4x1xf32>)
  %dlog = piper.moe_router_grad %logits, %idx, %dw {top_k = 2 : i64, norm_topk} : (tensor<4x4xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x4xf32>
  %slots = piper.moe_dispatch %x, %idx {experts = 4 : i64, capacity = 2 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> tensor<8x8xf32>
  %dx = piper.moe_dispatch_grad %idx, %slots {experts = 4 : i64, capacity = 2 : i64} : (tensor<4x2xi32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %w = piper.param_ref @experts.w : tensor<4x8x6xf32>
  %h = piper.expert_linear %slots, %w {experts = 4 : i64} : (tensor<8x8xf32>, tensor<4x8x6xf32>) -> tensor<8x6xf32>
  %dh = piper.expert_linear_grad_input %dslots, %w {experts = 4 : i64} : (tensor<8x6xf32>, tensor<4x8x6xf32>) -> tensor<8x8xf32>
  %dw2 = piper.expert_linear_grad_weight %slots, %dslots {experts = 4 : i64} : (tensor<8x8xf32>, tensor<8x6xf32>) -> tensor<4x8x6xf32>
  piper.accumulate_grad @experts.w, %dw2 : tensor<4x8x6xf32>
  %y = piper.moe_combine %h, %idx, %wts {experts = 4 : i64, capacity = 2 : i64} : (tensor<8x6xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x6xf32>
  %dh2, %dwts = piper.moe_combine_grad %h, %idx, %wts, %y {experts = 4 : i64, capacity = 2 : i64} : (tensor<8x6xf32>, tensor<4x2xi32>, tensor<4x2xf32>, tensor<4x6xf32>) -> (tensor<8x6xf32>, tensor<4x2xf32>)
  %aux = piper.moe_aux_loss %logits, %idx {experts = 4 : i64, top_k = 2 : i64, coeff = 1.0e-02 : f64} : (tensor<4x4xf32>, tensor<4x2xi32>) -> tensor<f32>
  piper.loss_accumulate %aux {coeff = 1.0e-02 : f64} : tensor<f32>
  %daux = piper.moe_aux_loss_grad %logits, %idx {experts = 4 : i64, top_k = 2 : i64, coeff = 1.0e-02 : f64} : (tensor<4x4xf32>, tensor<4x2xi32>) -> tensor<4x4xf32>
  piper.yield %y : tensor<4x6xf32>
}

// The optimizer step and clearing the accumulators; a bare yield.
// CHECK-LABEL: piper.segment @update() attributes {piper.pass = #piper.pass<U>}
// CHECK-NEXT: piper.adamw @wte {beta1 = 9.000000e-01 : f64, beta2 = 0.94999999999999996 : f64, eps = 1.000000e-08 : f64, lr = 1.000000e-03 : f64, weight_decay = 1.000000e-01 : f64}
// CHECK-NEXT: piper.zero_grad @wte
// CHECK-NEXT: piper.yield{{$}}
piper.segment @update() attributes {piper.pass = #piper.pass<U>} {
  piper.adamw @wte {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.1 : f64}
  piper.zero_grad @wte
  piper.yield
}

// A segment may take and return tokens (AnyType arguments and results).
// CHECK-LABEL: piper.segment @tokens(
// CHECK-SAME: [[T:%[^:]+]]: !piper.token) -> !piper.token
// CHECK-NEXT: piper.yield [[T]] : !piper.token
piper.segment @tokens(%t: !piper.token) -> !piper.token {
  piper.yield %t : !piper.token
}

// Activations for the program below.
// CHECK-LABEL: piper.segment @acts() -> (tensor<4x4xf32>, tensor<4x12xf32>)
piper.segment @acts() -> (tensor<4x4xf32>, tensor<4x12xf32>) {
  %g = piper.param_ref @ln.g : tensor<4xf32>
  %x = piper.param_ref @wte : tensor<16x4xf32>
  %a = piper.position_add_grad %x {seq = 4 : i64} : (tensor<16x4xf32>) -> tensor<4x4xf32>
  %q = piper.param_ref @qkv.w : tensor<4x12xf32>
  piper.yield %a, %q : tensor<4x4xf32>, tensor<4x12xf32>
}

// The training DAG: batch, tasks with and without deps/devices/stream,
// transfers with and without deps, a bucketed all-reduce.
// The step-level settings: given ones print, defaults (0, f32) do not, and
// every double survives the round trip exactly (printed in as many digits
// as it needs).
// CHECK-LABEL: piper.program @settings attributes {optimizer = #piper.optimizer<min_lr = 1.2345678901230001E-5, warmup_steps = 10, clip_grad_norm = 5.000000e-01, dtype = bf16>} {
piper.program @settings attributes {optimizer = #piper.optimizer<min_lr = 1.234567890123e-05, warmup_steps = 10, decay_steps = 0, clip_grad_norm = 0.5, dtype = bf16>} {
}
// CHECK-LABEL: piper.program @defaults attributes {optimizer = #piper.optimizer<>} {
piper.program @defaults attributes {optimizer = #piper.optimizer<dtype = f32>} {
}

// CHECK-LABEL: piper.program @train attributes {num_microbatches = 2 : i64, num_replicas = 2 : i64} {
// CHECK: [[TOK:%[^,]+]], [[TGT:%[^,]+]], [[BD:%[^ ]+]] = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x2xi32>, tensor<2x2xi32>
// CHECK: [[F:%[^:]+]]:2, [[FD:%[^ ]+]] = piper.task @forward([[TOK]], [[TGT]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = F, block = 0>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, tensor<4x16xf32>, !piper.token)
// CHECK: [[F2:%[^:]+]]:2, [[FD2:%[^ ]+]] = piper.task @forward([[TOK]], [[TGT]]) after([[BD]], [[FD]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, EP = 0, MB = 0, PASS = F>}
// CHECK: [[MOVED:%[^,]+]], [[TD:%[^ ]+]] = piper.transfer [[F2]]#1 {from = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<2, 3>} : tensor<4x16xf32>
// CHECK: piper.transfer [[MOVED]] after([[TD]]) {from = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<0, 1>} : tensor<4x16xf32>
// CHECK: [[ACT:%[^:]+]]:2, [[AD:%[^ ]+]] = piper.task @acts() {tag = #piper.tag<>} : () -> (tensor<4x4xf32>, tensor<4x12xf32>, !piper.token)
// CHECK: [[BW:%[^,]+]], [[BWD:%[^ ]+]] = piper.task @backward([[TOK]], [[ACT]]#0, [[ACT]]#1, [[ACT]]#0, [[MOVED]]) after([[TD]]) {devices = #piper.group<2, 3>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = B>}
// CHECK: [[AR:%.*]] = piper.all_reduce grads [@wte, @wpe] after([[BWD]]) {devices = #piper.group<2, 3>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 1>}
// CHECK: piper.all_reduce grads [@qkv.w] {devices = #piper.group<2, 3>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
// CHECK: piper.task @update() after([[AR]]) {devices = #piper.group<2, 3>, tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
// CHECK: piper.task @tokens([[AR]]) {tag = #piper.tag<PASS = BI>} : (!piper.token) -> (!piper.token, !piper.token)
// CHECK: piper.task @update() {tag = #piper.tag<PASS = BW>}
piper.program @train attributes {num_microbatches = 2 : i64, num_replicas = 2 : i64} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x2xi32>, tensor<2x2xi32>
  %loss, %logits, %fd = piper.task @forward(%tok, %tgt) {tag = #piper.tag<PP = 0, MB = 0, PASS = F, block = 0>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, tensor<4x16xf32>, !piper.token)
  %loss2, %logits2, %fd2 = piper.task @forward(%tok, %tgt) after(%bd, %fd) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, EP = 0, MB = 0, PASS = F>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, tensor<4x16xf32>, !piper.token)
  %moved, %td = piper.transfer %logits2 {from = #piper.group<0, 1>, to = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x16xf32>
  %back, %td2 = piper.transfer %moved after(%td) {from = #piper.group<2, 3>, to = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x16xf32>
  %act, %qkv, %ad = piper.task @acts() {tag = #piper.tag<>} : () -> (tensor<4x4xf32>, tensor<4x12xf32>, !piper.token)
  %dx, %bwd = piper.task @backward(%tok, %act, %qkv, %act, %moved) after(%td) {devices = #piper.group<2, 3>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = B>} : (tensor<2x2xi32>, tensor<4x4xf32>, tensor<4x12xf32>, tensor<4x4xf32>, tensor<4x16xf32>) -> (tensor<4x4xf32>, !piper.token)
  %ar = piper.all_reduce grads [@wte, @wpe] after(%bwd) {devices = #piper.group<2, 3>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 1>}
  %ar2 = piper.all_reduce grads [@qkv.w] {devices = #piper.group<2, 3>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
  %ud = piper.task @update() after(%ar) {devices = #piper.group<2, 3>, tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
  %t1, %t2 = piper.task @tokens(%ar) {tag = #piper.tag<PASS = BI>} : (!piper.token) -> (!piper.token, !piper.token)
  %ud2 = piper.task @update() {tag = #piper.tag<PASS = BW>} : () -> !piper.token
}

// Per-device programs: send and recv (with and without deps) paired by
// channel, a task, an all-reduce on the class's ranks and gradient clipping.
// CHECK-LABEL: piper.device_program @class0 attributes {device_class = 0 : i64, ranks = array<i64: 0, 1>} {
// CHECK: [[TOK:%[^,]+]], [[TGT:%[^,]+]], [[BD:%[^ ]+]] = piper.batch {tag = #piper.tag<MB = 0>}
// CHECK: [[F:%[^:]+]]:2, [[FD:%[^ ]+]] = piper.task @forward([[TOK]], [[TGT]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = F>}
// CHECK: [[S:%.*]] = piper.send [[F]]#1 {channel = 0 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x16xf32>
// CHECK: piper.send [[F]]#1 after([[S]], [[FD]]) {channel = 1 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x16xf32>
// CHECK: [[R:%[^,]+]], [[RD:%[^ ]+]] = piper.recv {channel = 2 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// CHECK: piper.recv after([[RD]]) {channel = 3 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
// CHECK: piper.all_reduce grads [@wte] after([[RD]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// CHECK: [[CLIP:%.*]] = piper.clip_grads after([[RD]]) {max_norm = 1.000000e+00 : f64}
// CHECK: piper.clip_grads after([[CLIP]]) {max_norm = 5.000000e-01 : f64}
// CHECK: piper.clip_grads {max_norm = 2.000000e+00 : f64}
piper.device_program @class0 attributes {device_class = 0 : i64, num_microbatches = 1 : i64, ranks = array<i64: 0, 1>} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x2xi32>, tensor<2x2xi32>
  %loss, %logits, %fd = piper.task @forward(%tok, %tgt) {devices = #piper.group<0, 1>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = F>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, tensor<4x16xf32>, !piper.token)
  %s = piper.send %logits {channel = 0 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x16xf32>
  %s2 = piper.send %logits after(%s, %fd) {channel = 1 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x16xf32>
  %r, %rd = piper.recv {channel = 2 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
  %r2, %rd2 = piper.recv after(%rd) {channel = 3 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<4x4xf32>
  %ar = piper.all_reduce grads [@wte] after(%rd) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
  %clip = piper.clip_grads after(%rd) {max_norm = 1.0 : f64}
  %clip2 = piper.clip_grads after(%clip) {max_norm = 0.5 : f64}
  %clip3 = piper.clip_grads {max_norm = 2.0 : f64}
}
