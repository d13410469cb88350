// Every verifier diagnostic of the piper dialect, and the ODS constraints
// that matter, one case per split.
// RUN: piper-opt %s -split-input-file -verify-diagnostics -allow-unregistered-dialect

//===----------------------------------------------------------------------===//
// piper.param
//===----------------------------------------------------------------------===//

// A parameter's shape must be static.
// expected-error @+1 {{'piper.param' op parameter shape must be static, got 'tensor<?x4xf32>'}}
piper.param @w : tensor<?x4xf32> init zeros(0.0)

// -----

// A parameter must be f32.
// expected-error @+1 {{'piper.param' op parameter element type must be f32, got 'f16'}}
piper.param @w : tensor<4xf16> init zeros(0.0)

// -----

// The initializer scale (a standard deviation) cannot be negative.
// expected-error @+1 {{'piper.param' op initializer scale must be non-negative}}
piper.param @w : tensor<4xf32> init normal(-1.0)

// -----

// Only zeros, ones and normal initializers exist.
// expected-error @+2 {{expected ::mlir::piper::InitKind to be one of: zeros, ones, normal}}
// expected-error @+1 {{failed to parse Piper_InitKindAttr parameter 'value'}}
piper.param @w : tensor<4xf32> init uniform(1.0)

// -----

// A parameter's type must be a ranked tensor.
// expected-error @+1 {{'piper.param' op attribute 'type' failed to satisfy constraint: type attribute of ranked tensor of any type values}}
"piper.param"() {sym_name = "w", type = f32, init = #piper<init zeros>, scale = 0.0 : f64} : () -> ()

// -----

//===----------------------------------------------------------------------===//
// piper.segment and piper.yield
//===----------------------------------------------------------------------===//

// A segment's body must end in piper.yield, not in another terminator.
// expected-error @+1 {{'piper.segment' op segment body must end in piper.yield}}
piper.segment @s() {
  "test.terminator"() : () -> ()
}

// -----

// A segment without a body is not a declaration: it needs its one block.
// expected-error @+1 {{'piper.segment' op region #0 ('body') failed to verify constraint: region with 1 blocks}}
piper.segment @s()

// -----

// A segment's block must not be empty.
// expected-error @+1 {{'piper.segment' op expects a non-empty block}}
piper.segment @s() {
^bb0:
}

// -----

// piper.yield yields exactly the segment's results: the count.
piper.segment @s(%x: tensor<4x4xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.yield' op yields 1 values but segment @s returns 2}}
  piper.yield %x : tensor<4x4xf32>
}

// -----

// piper.yield yields exactly the segment's results: the types.
piper.segment @s(%x: tensor<4x4xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'piper.yield' op result #0 has type 'tensor<4x4xf32>' but the segment returns 'tensor<4x8xf32>'}}
  piper.yield %x : tensor<4x4xf32>
}

// -----

// piper.yield only terminates segments.
piper.program @p {
  // expected-error @+1 {{'piper.yield' op expects parent op 'piper.segment'}}
  piper.yield
}

// -----

//===----------------------------------------------------------------------===//
// Symbol users: param_ref, accumulate_grad, adamw, zero_grad
//===----------------------------------------------------------------------===//

// param_ref must name a declared parameter.
piper.segment @s() -> tensor<4xf32> {
  // expected-error @+1 {{'piper.param_ref' op references unknown parameter @missing}}
  %w = piper.param_ref @missing : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}

// -----

// param_ref's type is the parameter's type.
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @s() -> tensor<4x8xf32> {
  // expected-error @+1 {{'piper.param_ref' op type 'tensor<4x8xf32>' does not match parameter @w of type 'tensor<4x4xf32>'}}
  %w = piper.param_ref @w : tensor<4x8xf32>
  piper.yield %w : tensor<4x8xf32>
}

// -----

// A symbol that is not a parameter is an unknown parameter.
piper.segment @s() -> tensor<4xf32> {
  // expected-error @+1 {{'piper.param_ref' op references unknown parameter @s}}
  %w = piper.param_ref @s : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}

// -----

// accumulate_grad's gradient has the parameter's type.
piper.param @w : tensor<4x4xf32> init zeros(0.0)
piper.segment @s(%g: tensor<4xf32>) {
  // expected-error @+1 {{'piper.accumulate_grad' op gradient type 'tensor<4xf32>' does not match parameter @w of type 'tensor<4x4xf32>'}}
  piper.accumulate_grad @w, %g : tensor<4xf32>
  piper.yield
}

// -----

// accumulate_grad must name a declared parameter.
piper.segment @s(%g: tensor<4xf32>) {
  // expected-error @+1 {{'piper.accumulate_grad' op references unknown parameter @missing}}
  piper.accumulate_grad @missing, %g : tensor<4xf32>
  piper.yield
}

// -----

// adamw must name a declared parameter.
piper.segment @s() {
  // expected-error @+1 {{'piper.adamw' op references unknown parameter @missing}}
  piper.adamw @missing {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  piper.yield
}

// -----

// adamw needs all of its hyper-parameters.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @s() {
  // expected-error @+1 {{'piper.adamw' op requires attribute 'weight_decay'}}
  piper.adamw @w {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64}
  piper.yield
}

// -----

// zero_grad must name a declared parameter.
piper.segment @s() {
  // expected-error @+1 {{'piper.zero_grad' op references unknown parameter @missing}}
  piper.zero_grad @missing
  piper.yield
}

// -----

// loss_accumulate takes a scalar loss.
piper.segment @s(%l: tensor<1xf32>) {
  // expected-error @+1 {{'piper.loss_accumulate' op operand #0 must be 0D tensor of 32-bit float values, but got 'tensor<1xf32>'}}
  piper.loss_accumulate %l : tensor<1xf32>
  piper.yield
}

// -----

//===----------------------------------------------------------------------===//
// Compute ops: ODS types
//===----------------------------------------------------------------------===//

// Activations are rank 2.
piper.segment @s(%x: tensor<4xf32>, %w: tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.linear' op operand #0 must be statically shaped 2-D tensor of f32, but got 'tensor<4xf32>'}}
  %y = piper.linear %x, %w : (tensor<4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// Activations are f32.
piper.segment @s(%x: tensor<4x4xf16>) {
  // expected-error @+1 {{'piper.gelu' op operand #0 must be statically shaped 2-D tensor of f32, but got 'tensor<4x4xf16>'}}
  %y = piper.gelu %x : tensor<4x4xf16>
  piper.yield
}

// -----

// Token ids are i32.
piper.segment @s(%ids: tensor<2x2xi64>, %w: tensor<16x4xf32>) {
  // expected-error @+1 {{'piper.embedding' op operand #0 must be statically shaped 2-D tensor of i32, but got 'tensor<2x2xi64>'}}
  %y = piper.embedding %ids, %w : (tensor<2x2xi64>, tensor<16x4xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// The loss is a scalar.
piper.segment @s(%l: tensor<4x16xf32>, %t: tensor<2x2xi32>) {
  // expected-error @+1 {{'piper.cross_entropy' op result #0 must be 0D tensor of 32-bit float values, but got 'tensor<1xf32>'}}
  %loss = piper.cross_entropy %l, %t : (tensor<4x16xf32>, tensor<2x2xi32>) -> tensor<1xf32>
  piper.yield
}

// -----

// layer_norm's gamma is a vector.
piper.segment @s(%x: tensor<4x4xf32>, %g: tensor<1x4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'piper.layer_norm' op operand #1 must be statically shaped 1-D tensor of f32, but got 'tensor<1x4xf32>'}}
  %y = piper.layer_norm %x, %g, %b : (tensor<4x4xf32>, tensor<1x4xf32>, tensor<4xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// add's operands and result have one type.
piper.segment @s(%x: tensor<4x4xf32>, %y: tensor<4x8xf32>) {
  // expected-error @+1 {{'piper.add' op requires the same type for all operands and results}}
  %z = "piper.add"(%x, %y) : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

//===----------------------------------------------------------------------===//
// Compute ops: shapes
//===----------------------------------------------------------------------===//

// embedding: one row per token, the table's width.
piper.segment @s(%ids: tensor<2x2xi32>, %w: tensor<16x4xf32>) {
  // expected-error @+1 {{'piper.embedding' op result must be [4, 4], got 'tensor<2x4xf32>'}}
  %y = piper.embedding %ids, %w : (tensor<2x2xi32>, tensor<16x4xf32>) -> tensor<2x4xf32>
  piper.yield
}

// -----

// position_add: seq must be positive.
piper.segment @s(%x: tensor<4x4xf32>, %p: tensor<2x4xf32>) {
  // expected-error @+1 {{'piper.position_add' op seq must be positive}}
  %y = piper.position_add %x, %p {seq = 0 : i64} : (tensor<4x4xf32>, tensor<2x4xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// position_add: the rows hold whole sequences.
piper.segment @s(%x: tensor<5x4xf32>, %p: tensor<2x4xf32>) {
  // expected-error @+1 {{'piper.position_add' op rows (5) must be a multiple of seq (2)}}
  %y = piper.position_add %x, %p {seq = 2 : i64} : (tensor<5x4xf32>, tensor<2x4xf32>) -> tensor<5x4xf32>
  piper.yield
}

// -----

// position_add: the table covers a sequence.
piper.segment @s(%x: tensor<4x4xf32>, %p: tensor<1x4xf32>) {
  // expected-error @+1 {{'piper.position_add' op position table 'tensor<1x4xf32>' must have at least 2 rows of width 4}}
  %y = piper.position_add %x, %p {seq = 2 : i64} : (tensor<4x4xf32>, tensor<1x4xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// position_add: the table has the activation's width.
piper.segment @s(%x: tensor<4x4xf32>, %p: tensor<2x8xf32>) {
  // expected-error @+1 {{'piper.position_add' op position table 'tensor<2x8xf32>' must have at least 2 rows of width 4}}
  %y = piper.position_add %x, %p {seq = 2 : i64} : (tensor<4x4xf32>, tensor<2x8xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// position_add: the result has the input's type.
piper.segment @s(%x: tensor<4x4xf32>, %p: tensor<2x4xf32>) {
  // expected-error @+1 {{'piper.position_add' op result type must equal the input type}}
  %y = piper.position_add %x, %p {seq = 2 : i64} : (tensor<4x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  piper.yield
}

// -----

// layer_norm: gamma and beta span the width.
piper.segment @s(%x: tensor<4x4xf32>, %g: tensor<4xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{'piper.layer_norm' op gamma and beta must have 4 elements}}
  %y = piper.layer_norm %x, %g, %b : (tensor<4x4xf32>, tensor<4xf32>, tensor<8xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// layer_norm: the result has the input's type.
piper.segment @s(%x: tensor<4x4xf32>, %g: tensor<4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'piper.layer_norm' op result type must equal the input type}}
  %y = piper.layer_norm %x, %g, %b : (tensor<4x4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<8x4xf32>
  piper.yield
}

// -----

// linear: the weight's rows match the input's columns.
piper.segment @s(%x: tensor<4x4xf32>, %w: tensor<8x4xf32>) {
  // expected-error @+1 {{'piper.linear' op input has 4 columns but the weight 'tensor<8x4xf32>' expects 8}}
  %y = piper.linear %x, %w : (tensor<4x4xf32>, tensor<8x4xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// linear with transpose_w: the weight's columns match the input's columns.
piper.segment @s(%x: tensor<4x4xf32>, %w: tensor<4x8xf32>) {
  // expected-error @+1 {{'piper.linear' op input has 4 columns but the weight 'tensor<4x8xf32>' expects 8}}
  %y = piper.linear %x, %w {transpose_w} : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// linear: the bias spans the output width.
piper.segment @s(%x: tensor<4x4xf32>, %w: tensor<4x8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{'piper.linear' op bias must have 8 elements}}
  %y = piper.linear %x, %w, %b : (tensor<4x4xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<4x8xf32>
  piper.yield
}

// -----

// linear: the result is [N, M].
piper.segment @s(%x: tensor<4x4xf32>, %w: tensor<4x8xf32>) {
  // expected-error @+1 {{'piper.linear' op result must be [4, 8], got 'tensor<4x4xf32>'}}
  %y = piper.linear %x, %w : (tensor<4x4xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// attention: heads and seq must be positive.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op heads, kv_heads and seq must be positive}}
  %y, %y_lse = piper.attention %qkv {heads = 0 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x0xf32>)
  piper.yield
}

// -----

// attention: so is kv_heads.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op heads, kv_heads and seq must be positive}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, kv_heads = 0 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// attention: the width splits evenly into heads.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op width 4 is not divisible by 3 heads}}
  %y, %y_lse = piper.attention %qkv {heads = 3 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x6xf32>)
  piper.yield
}

// -----

// attention: query heads share kv heads in equal groups.
piper.segment @s(%qkv: tensor<4x20xf32>) {
  // expected-error @+1 {{'piper.attention' op heads (4) must be a multiple of kv_heads (3)}}
  %y, %y_lse = piper.attention %qkv {heads = 4 : i64, kv_heads = 3 : i64, seq = 2 : i64} : (tensor<4x20xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>)
  piper.yield
}

// -----

// attention: qkv packs q, k and v of the result's width.
piper.segment @s(%qkv: tensor<4x8xf32>) {
  // expected-error @+1 {{'piper.attention' op qkv must have (heads + 2 * kv_heads) * head_dim = 12 columns, got 8}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64} : (tensor<4x8xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// attention: with grouped-query attention, k and v have kv_heads heads.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op qkv must have (heads + 2 * kv_heads) * head_dim = 8 columns, got 12}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, kv_heads = 1 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// attention: rotary embeddings rotate pairs, so the head dimension is even.
piper.segment @s(%qkv: tensor<4x18xf32>) {
  // expected-error @+1 {{'piper.attention' op rotary embeddings need an even head dimension and a positive rope_theta}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64, rope_theta = 1.0e+04 : f64} : (tensor<4x18xf32>) -> (tensor<4x6xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// attention: and rope_theta is positive.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op rotary embeddings need an even head dimension and a positive rope_theta}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64, rope_theta = 0.0 : f64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// attention: the rows hold whole sequences.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op rows must match and be a multiple of seq}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 3 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x4xf32>)
  piper.yield
}

// -----

// attention: the result has qkv's rows.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op rows must match and be a multiple of seq}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<2x4xf32>, tensor<2x4xf32>)
  piper.yield
}

// -----

// attention: lse holds a (bf16, rest) pair per head and row.
piper.segment @s(%qkv: tensor<4x12xf32>) {
  // expected-error @+1 {{'piper.attention' op lse must be [4, 4] (rows, 2 * heads)}}
  %y, %y_lse = piper.attention %qkv {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>) -> (tensor<4x4xf32>, tensor<4x2xf32>)
  piper.yield
}

// -----

// attention_grad: the forward's y and lse, as the forward gives them.
piper.segment @s(%qkv: tensor<4x12xf32>, %y: tensor<4x4xf32>, %lse: tensor<4x2xf32>, %dy: tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.attention_grad' op lse must be [4, 4] (rows, 2 * heads)}}
  %d = piper.attention_grad %qkv, %y, %lse, %dy {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>, tensor<4x4xf32>, tensor<4x2xf32>, tensor<4x4xf32>) -> tensor<4x12xf32>
  piper.yield
}

// -----

piper.segment @s(%qkv: tensor<4x12xf32>, %y: tensor<2x4xf32>, %lse: tensor<4x4xf32>, %dy: tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.attention_grad' op y and grad must have qkv's rows and one type}}
  %d = piper.attention_grad %qkv, %y, %lse, %dy {heads = 2 : i64, seq = 2 : i64} : (tensor<4x12xf32>, tensor<2x4xf32>, tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x12xf32>
  piper.yield
}

// -----

// qk_norm: kv_heads divides heads.
piper.segment @s(%x: tensor<4x14xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{'piper.qk_norm' op heads (3) must be a positive multiple of kv_heads (2)}}
  %y = piper.qk_norm %x, %g {heads = 3 : i64, kv_heads = 2 : i64} : (tensor<4x14xf32>, tensor<4xf32>) -> tensor<4x14xf32>
  piper.yield
}

// -----

// qk_norm: q|k|v holds heads + 2 kv_heads heads of the gamma's half.
piper.segment @s(%x: tensor<4x12xf32>, %g: tensor<6xf32>) {
  // expected-error @+1 {{'piper.qk_norm' op gamma must be [2 * hd] and qkv [N, (heads + 2 * kv_heads) * hd], got 'tensor<6xf32>' and 'tensor<4x12xf32>'}}
  %y = piper.qk_norm %x, %g {heads = 2 : i64} : (tensor<4x12xf32>, tensor<6xf32>) -> tensor<4x12xf32>
  piper.yield
}

// -----

// qk_norm: the result has the input's type.
piper.segment @s(%x: tensor<4x12xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{'piper.qk_norm' op result type must equal the qkv type}}
  %y = piper.qk_norm %x, %g {heads = 2 : i64} : (tensor<4x12xf32>, tensor<4xf32>) -> tensor<2x12xf32>
  piper.yield
}

// -----

// rms_norm: gamma spans the width.
piper.segment @s(%x: tensor<4x4xf32>, %g: tensor<8xf32>) {
  // expected-error @+1 {{'piper.rms_norm' op gamma must have 4 elements}}
  %y = piper.rms_norm %x, %g : (tensor<4x4xf32>, tensor<8xf32>) -> tensor<4x4xf32>
  piper.yield
}

// -----

// rms_norm: the result has the input's type.
piper.segment @s(%x: tensor<4x4xf32>, %g: tensor<4xf32>) {
  // expected-error @+1 {{'piper.rms_norm' op result type must equal the input type}}
  %y = piper.rms_norm %x, %g : (tensor<4x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  piper.yield
}

// -----

// swiglu: the input packs gate and up, twice the result's width.
piper.segment @s(%x: tensor<4x8xf32>) {
  // expected-error @+1 {{'piper.swiglu' op input must be [N, 2F] for a result [N, F], got 'tensor<4x8xf32>' -> 'tensor<4x3xf32>'}}
  %y = piper.swiglu %x : (tensor<4x8xf32>) -> tensor<4x3xf32>
  piper.yield
}

// -----

// moe_router: top_k is at least 1.
piper.segment @s(%l: tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.moe_router' op top_k must be in [1, 4], got 0}}
  %i, %w = piper.moe_router %l {top_k = 0 : i64} : (tensor<4x4xf32>) -> (tensor<4x0xi32>, tensor<4x0xf32>)
  piper.yield
}

// -----

// moe_router: top_k is at most the number of experts.
piper.segment @s(%l: tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.moe_router' op top_k must be in [1, 4], got 5}}
  %i, %w = piper.moe_router %l {top_k = 5 : i64} : (tensor<4x4xf32>) -> (tensor<4x5xi32>, tensor<4x5xf32>)
  piper.yield
}

// -----

// moe_router: one row of top_k choices per token.
piper.segment @s(%l: tensor<4x4xf32>) {
  // expected-error @+1 {{'piper.moe_router' op indices and weights must be [4, 2]}}
  %i, %w = piper.moe_router %l {top_k = 2 : i64} : (tensor<4x4xf32>) -> (tensor<4x2xi32>, tensor<4x1xf32>)
  piper.yield
}

// -----

// moe_dispatch: experts and capacity are positive.
piper.segment @s(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{'piper.moe_dispatch' op experts and capacity must be positive}}
  %y = piper.moe_dispatch %x, %i {experts = 4 : i64, capacity = 0 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> tensor<8x8xf32>
  piper.yield
}

// -----

// moe_dispatch: the result has a row per expert slot.
piper.segment @s(%x: tensor<4x8xf32>, %i: tensor<4x2xi32>) {
  // expected-error @+1 {{'piper.moe_dispatch' op result must be [experts * capacity, width] = [12, 8]}}
  %y = piper.moe_dispatch %x, %i {experts = 4 : i64, capacity = 3 : i64} : (tensor<4x8xf32>, tensor<4x2xi32>) -> tensor<8x8xf32>
  piper.yield
}

// -----

// moe_dispatch: one row of choices per token.
piper.segment @s(%x: tensor<4x8xf32>, %i: tensor<2x2xi32>) {
  // expected-error @+1 {{'piper.moe_dispatch' op indices must have one row per token}}
  %y = piper.moe_dispatch %x, %i {experts = 4 : i64, capacity = 2 : i64} : (tensor<4x8xf32>, tensor<2x2xi32>) -> tensor<8x8xf32>
  piper.yield
}

// -----

// moe_combine: experts and capacity are positive.
piper.segment @s(%x: tensor<8x8xf32>, %i: tensor<4x2xi32>, %w: tensor<4x2xf32>) {
  // expected-error @+1 {{'piper.moe_combine' op experts and capacity must be positive}}
  %y = piper.moe_combine %x, %i, %w {experts = 0 : i64, capacity = 2 : i64} : (tensor<8x8xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x8xf32>
  piper.yield
}

// -----

// moe_combine: the input has a row per expert slot.
piper.segment @s(%x: tensor<6x8xf32>, %i: tensor<4x2xi32>, %w: tensor<4x2xf32>) {
  // expected-error @+1 {{'piper.moe_combine' op input must have experts * capacity = 8 rows}}
  %y = piper.moe_combine %x, %i, %w {experts = 4 : i64, capacity = 2 : i64} : (tensor<6x8xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<4x8xf32>
  piper.yield
}

// -----

// moe_combine: a weight per routing choice.
piper.segment @s(%x: tensor<8x8xf32>, %i: tensor<4x2xi32>, %w: tensor<4x1xf32>) {
  // expected-error @+1 {{'piper.moe_combine' op indices and weights must have the same shape}}
  %y = piper.moe_combine %x, %i, %w {experts = 4 : i64, capacity = 2 : i64} : (tensor<8x8xf32>, tensor<4x2xi32>, tensor<4x1xf32>) -> tensor<4x8xf32>
  piper.yield
}

// -----

// moe_combine: the result is [tokens, width].
piper.segment @s(%x: tensor<8x8xf32>, %i: tensor<4x2xi32>, %w: tensor<4x2xf32>) {
  // expected-error @+1 {{'piper.moe_combine' op result must be [tokens, width]}}
  %y = piper.moe_combine %x, %i, %w {experts = 4 : i64, capacity = 2 : i64} : (tensor<8x8xf32>, tensor<4x2xi32>, tensor<4x2xf32>) -> tensor<8x8xf32>
  piper.yield
}

// -----

// expert_linear: one weight matrix per expert.
piper.segment @s(%x: tensor<8x4xf32>, %w: tensor<2x4x6xf32>) {
  // expected-error @+1 {{'piper.expert_linear' op weight must have 4 experts}}
  %y = piper.expert_linear %x, %w {experts = 4 : i64} : (tensor<8x4xf32>, tensor<2x4x6xf32>) -> tensor<8x6xf32>
  piper.yield
}

// -----

// expert_linear: each expert has the same number of slots.
piper.segment @s(%x: tensor<6x4xf32>, %w: tensor<4x4x6xf32>) {
  // expected-error @+1 {{'piper.expert_linear' op rows must be a multiple of the expert count}}
  %y = piper.expert_linear %x, %w {experts = 4 : i64} : (tensor<6x4xf32>, tensor<4x4x6xf32>) -> tensor<6x6xf32>
  piper.yield
}

// -----

// expert_linear: [slots, K] x [E, K, M] -> [slots, M].
piper.segment @s(%x: tensor<8x4xf32>, %w: tensor<4x5x6xf32>) {
  // expected-error @+1 {{'piper.expert_linear' op shapes do not chain: 'tensor<8x4xf32>' x 'tensor<4x5x6xf32>' -> 'tensor<8x6xf32>'}}
  %y = piper.expert_linear %x, %w {experts = 4 : i64} : (tensor<8x4xf32>, tensor<4x5x6xf32>) -> tensor<8x6xf32>
  piper.yield
}

// -----

// expert_linear: the weight is rank 3.
piper.segment @s(%x: tensor<8x4xf32>, %w: tensor<4x6xf32>) {
  // expected-error @+1 {{'piper.expert_linear' op operand #1 must be statically shaped 3-D tensor of f32, but got 'tensor<4x6xf32>'}}
  %y = piper.expert_linear %x, %w {experts = 4 : i64} : (tensor<8x4xf32>, tensor<4x6xf32>) -> tensor<8x6xf32>
  piper.yield
}

// -----

// cross_entropy: one logits row per target token.
piper.segment @s(%l: tensor<4x16xf32>, %t: tensor<2x4xi32>) {
  // expected-error @+1 {{'piper.cross_entropy' op logits have 4 rows but targets hold 8 tokens}}
  %loss = piper.cross_entropy %l, %t : (tensor<4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  piper.yield
}

// -----

// cross_entropy_fused: as cross_entropy, and dlogits of the logits' type.
piper.segment @s(%l: tensor<4x16xf32>, %t: tensor<2x4xi32>) {
  // expected-error @+1 {{'piper.cross_entropy_fused' op logits have 4 rows but targets hold 8 tokens}}
  %loss, %dl = piper.cross_entropy_fused %l, %t : (tensor<4x16xf32>, tensor<2x4xi32>) -> (tensor<f32>, tensor<4x16xf32>)
  piper.yield
}

// -----

piper.segment @s(%l: tensor<8x16xf32>, %t: tensor<2x4xi32>) {
  // expected-error @+1 {{'piper.cross_entropy_fused' op dlogits must have the logits' type 'tensor<8x16xf32>', got 'tensor<8x8xf32>'}}
  %loss, %dl = piper.cross_entropy_fused %l, %t : (tensor<8x16xf32>, tensor<2x4xi32>) -> (tensor<f32>, tensor<8x8xf32>)
  piper.yield
}

// -----

// linear_grad_weight_bias: x and dy share their rows, dw has the weight's
// layout, db one element per output feature.
piper.segment @s(%x: tensor<4x8xf32>, %dy: tensor<5x16xf32>) {
  // expected-error @+1 {{'piper.linear_grad_weight_bias' op input and grad must have the same rows, got 4 and 5}}
  %dw, %db = piper.linear_grad_weight_bias %x, %dy : (tensor<4x8xf32>, tensor<5x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  piper.yield
}

// -----

piper.segment @s(%x: tensor<4x8xf32>, %dy: tensor<4x16xf32>) {
  // expected-error @+1 {{'piper.linear_grad_weight_bias' op weight gradient must be [16, 8], got 'tensor<8x16xf32>'}}
  %dw, %db = piper.linear_grad_weight_bias %x, %dy {transpose_w} : (tensor<4x8xf32>, tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<16xf32>)
  piper.yield
}

// -----

piper.segment @s(%x: tensor<4x8xf32>, %dy: tensor<4x16xf32>) {
  // expected-error @+1 {{'piper.linear_grad_weight_bias' op bias gradient must have 16 elements}}
  %dw, %db = piper.linear_grad_weight_bias %x, %dy : (tensor<4x8xf32>, tensor<4x16xf32>) -> (tensor<8x16xf32>, tensor<8xf32>)
  piper.yield
}

// -----

//===----------------------------------------------------------------------===//
// piper.program and piper.device_program
//===----------------------------------------------------------------------===//

// A program holds program nodes only: no parameters.
piper.program @p {
  // expected-error @+1 {{'piper.param' op is not a program node}}
  piper.param @w : tensor<4xf32> init zeros(0.0)
}

// -----

// A program holds program nodes only: no ops of other dialects.
piper.program @p {
  // expected-error @+1 {{'test.op' op is not a program node}}
  "test.op"() : () -> ()
}

// -----

// A device program holds program nodes only.
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  // expected-error @+1 {{'piper.segment' op is not a program node}}
  piper.segment @s() {
    piper.yield
  }
}

// -----

// The microbatch count is positive.
// expected-error @+1 {{'piper.program' op num_microbatches and num_replicas must be positive}}
piper.program @p attributes {num_microbatches = 0 : i64} {
}

// -----

// The replica count is positive.
// expected-error @+1 {{'piper.program' op num_microbatches and num_replicas must be positive}}
piper.program @p attributes {num_replicas = 0 : i64} {
}

// -----

// A device program's ranks are a device group: not empty.
// expected-error @+1 {{'piper.device_program' op ranks must name at least one device}}
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64>} {
}

// -----

// A device program's ranks are a device group: no negative device.
// expected-error @+1 {{'piper.device_program' op ranks has a negative device -2}}
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0, -2>} {
}

// -----

// A device program's ranks are a device group: no device twice.
// expected-error @+1 {{'piper.device_program' op ranks names device 1 twice}}
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 1, 1>} {
}

// -----

// A device program names its class.
// expected-error @+1 {{'piper.device_program' op requires attribute 'device_class'}}
piper.device_program @c attributes {ranks = array<i64: 0>} {
}

// -----

//===----------------------------------------------------------------------===//
// piper.batch and tags
//===----------------------------------------------------------------------===//

// Tokens and targets share one type.
piper.program @p {
  // expected-error @+1 {{'piper.batch' op tokens and targets must have the same type}}
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x4xi32>
}

// -----

// Nodes live in a program.
piper.segment @s() {
  // expected-error @+1 {{'piper.batch' op expects parent op to be one of 'piper.program, piper.device_program'}}
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  piper.yield
}

// -----

// Tags know PP, EP, MB, PASS and block only.
piper.program @p {
  // expected-error @+1 {{unknown tag key 'TP' (expected PP, EP, MB, PASS or block)}}
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<TP = 0>} : tensor<2x2xi32>, tensor<2x2xi32>
}

// -----

// PASS is one of F, B, BI, BW, U.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{tag PASS must be one of F, B, BI, BW, U, got 'X'}}
  %d = piper.task @s() {tag = #piper.tag<PASS = X>} : () -> !piper.token
}

// -----

// PASS is a name, not a number.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{expected valid keyword}}
  %d = piper.task @s() {tag = #piper.tag<PASS = 1>} : () -> !piper.token
}

// -----

// Tag indices are non-negative.
piper.program @p {
  // expected-error @+1 {{tag MB must be a non-negative integer, got -1}}
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<MB = -1>} : tensor<2x2xi32>, tensor<2x2xi32>
}

// -----

// Tag indices are integers.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{expected integer value}}
  %d = piper.task @s() {tag = #piper.tag<PP = "0">} : () -> !piper.token
}

// -----

// Every task carries a tag.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op requires attribute 'tag'}}
  %d = piper.task @s() : () -> !piper.token
}

// -----

//===----------------------------------------------------------------------===//
// piper.task
//===----------------------------------------------------------------------===//

// A task calls a segment of the module.
piper.program @p {
  // expected-error @+1 {{'piper.task' op calls unknown segment @missing}}
  %d = piper.task @missing() {tag = #piper.tag<>} : () -> !piper.token
}

// -----

// A task passes as many arguments as its segment takes.
piper.segment @s(%x: tensor<4x4xf32>, %y: tensor<4x4xf32>) {
  piper.yield
}
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.task' op passes 1 arguments but @s takes 2}}
  %d = piper.task @s(%tok) {tag = #piper.tag<>} : (tensor<2x2xi32>) -> !piper.token
}

// -----

// A task passes arguments of the segment's types.
piper.segment @s(%x: tensor<4x4xf32>) {
  piper.yield
}
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.task' op argument #0 has type 'tensor<2x2xi32>' but @s expects 'tensor<4x4xf32>'}}
  %d = piper.task @s(%tok) {tag = #piper.tag<>} : (tensor<2x2xi32>) -> !piper.token
}

// -----

// A task returns the segment's results (plus its token).
piper.segment @s() -> tensor<4x4xf32> {
  %x = "test.make"() : () -> tensor<4x4xf32>
  piper.yield %x : tensor<4x4xf32>
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op result types do not match the results of @s}}
  %x, %d = piper.task @s() {tag = #piper.tag<>} : () -> (tensor<4x8xf32>, !piper.token)
}

// -----

// A task returns every result of the segment.
piper.segment @s() -> tensor<4x4xf32> {
  %x = "test.make"() : () -> tensor<4x4xf32>
  piper.yield %x : tensor<4x4xf32>
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op result types do not match the results of @s}}
  %d = piper.task @s() {tag = #piper.tag<>} : () -> !piper.token
}

// -----

// A task's last result is its completion token.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op result #0 must be An ordering-only edge of the training DAG, but got 'tensor<4xf32>'}}
  %d = piper.task @s() {tag = #piper.tag<>} : () -> tensor<4xf32>
}

// -----

// A task only waits on tokens.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-note @+1 {{prior use here}}
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{use of value '%tok' expects different type than prior uses: '!piper.token' vs 'tensor<2x2xi32>'}}
  %d = piper.task @s() after(%tok) {tag = #piper.tag<>} : () -> !piper.token
}

// -----

// A task's device group is not empty.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{a device group must name at least one device}}
  %d = piper.task @s() {devices = #piper.group<>, tag = #piper.tag<>} : () -> !piper.token
}

// -----

// A task's device group has no negative device.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{a device group has a negative device -1}}
  %d = piper.task @s() {devices = #piper.group<-1>, tag = #piper.tag<>} : () -> !piper.token
}

// -----

// A task's device group names each device once.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{a device group names device 3 twice}}
  %d = piper.task @s() {devices = #piper.group<3, 2, 3>, tag = #piper.tag<>} : () -> !piper.token
}

// -----

//===----------------------------------------------------------------------===//
// piper.transfer
//===----------------------------------------------------------------------===//

// A transfer's source group is not empty.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{a device group must name at least one device}}
  %y, %d = piper.transfer %tok {from = #piper.group<>, to = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// A transfer's target group has no negative device.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{a device group has a negative device -1}}
  %y, %d = piper.transfer %tok {from = #piper.group<0>, to = #piper.group<-1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// A transfer's target group names each device once.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{a device group names device 1 twice}}
  %y, %d = piper.transfer %tok {from = #piper.group<0, 2>, to = #piper.group<1, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// Member i of `from` sends to member i of `to`: the groups have one size.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.transfer' op from and to must have the same size (2 vs 1)}}
  %y, %d = piper.transfer %tok {from = #piper.group<0, 1>, to = #piper.group<2>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// A transfer moves a tensor without changing its type.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.transfer' op failed to verify that all of {input, result} have same type}}
  %y, %d = "piper.transfer"(%tok) {from = #piper.group<0>, to = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>, operandSegmentSizes = array<i32: 1, 0>} : (tensor<2x2xi32>) -> (tensor<4xi32>, !piper.token)
}

// -----

// Transfers belong to the global program; device programs use send/recv.
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.transfer' op expects parent op 'piper.program'}}
  %y, %d = piper.transfer %tok {from = #piper.group<0>, to = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// A transfer names its stream.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.transfer' op requires attribute 'stream'}}
  %y, %d = piper.transfer %tok {from = #piper.group<0>, to = #piper.group<1>} : tensor<2x2xi32>
}

// -----

//===----------------------------------------------------------------------===//
// piper.all_reduce
//===----------------------------------------------------------------------===//

// An all-reduce reduces at least one parameter.
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op must reduce at least one parameter}}
  %d = piper.all_reduce grads [] {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
}

// -----

// An all-reduce reduces declared parameters.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op references unknown parameter @missing}}
  %d = piper.all_reduce grads [@w, @missing] {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
}

// -----

// An all-reduce's device group is not empty.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{a device group must name at least one device}}
  %d = piper.all_reduce grads [@w] {devices = #piper.group<>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
}

// -----

// An all-reduce's device group names each device once.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{a device group names device 0 twice}}
  %d = piper.all_reduce grads [@w] {devices = #piper.group<0, 0>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
}

// -----

// An all-reduce's tag follows the tag rules.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op attribute 'tag' failed to satisfy constraint}}
  %d = piper.all_reduce grads [@w] {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = {PP = 0 : i64}}
}

// -----

//===----------------------------------------------------------------------===//
// piper.send and piper.recv
//===----------------------------------------------------------------------===//

// Sends live in device programs.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.send' op expects parent op 'piper.device_program'}}
  %d = piper.send %tok {channel = 0 : i64, peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// Receives live in device programs.
piper.program @p {
  // expected-error @+1 {{'piper.recv' op expects parent op 'piper.device_program'}}
  %x, %d = piper.recv {channel = 0 : i64, peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// A receive names its channel.
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  // expected-error @+1 {{'piper.recv' op requires attribute 'channel'}}
  %x, %d = piper.recv {peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>} : tensor<2x2xi32>
}

// -----

// Send moves tensors, not tokens.
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{'piper.send' op operand #0 must be ranked tensor of any type values, but got '!piper.token'}}
  %d = "piper.send"(%bd) {channel = 0 : i64, peers = #piper.group<1>, stream = #piper.stream<"pp_stream", comm>, operandSegmentSizes = array<i32: 1, 0>} : (!piper.token) -> !piper.token
}

// -----

// Gradient clipping is a per-device node: it lives in device programs.
piper.program @p {
  // expected-error @+1 {{'piper.clip_grads' op expects parent op 'piper.device_program'}}
  %c = piper.clip_grads {max_norm = 1.0 : f64}
}

// -----

// Tensor compute and state updates belong in segments, not in the program.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.zero_grad' op is not a program node}}
  piper.zero_grad @w
}

// -----

// All-reduce names parameters by flat symbol references.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.program @p {
  // expected-error @+1 {{'piper.all_reduce' op attribute 'grads' failed to satisfy constraint: flat symbol ref array attribute}}
  %t = piper.all_reduce grads [@w::@x] {devices = #piper.group<0>, stream = #piper.stream<"s", comm>, tag = #piper.tag<>}
}

// -----

// Counts are signed: a negative microbatch count is rejected.
// expected-error @+1 {{'piper.program' op num_microbatches and num_replicas must be positive}}
piper.program @p attributes {num_microbatches = -3 : i64} {
}

// -----

// Shapes are static everywhere.
piper.segment @s(%ids: tensor<?x?xi32>, %t: tensor<16x4xf32>) -> tensor<4x4xf32> {
  // expected-error @+1 {{'piper.embedding' op operand #0 must be statically shaped 2-D tensor of i32, but got 'tensor<?x?xi32>'}}
  %y = piper.embedding %ids, %t : (tensor<?x?xi32>, tensor<16x4xf32>) -> tensor<4x4xf32>
  piper.yield %y : tensor<4x4xf32>
}

// -----

// A tag names each key once.
piper.program @p {
  // expected-error @+1 {{tag key 'MB' given twice}}
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<MB = 0, MB = 1>} : tensor<2x2xi32>, tensor<2x2xi32>
}

// -----

// The pass of a segment is a #piper.pass.
// expected-error @+1 {{'piper.pass' must be a #piper.pass, got "F"}}
piper.segment @s() attributes {piper.pass = "F"} {
  piper.yield
}

// -----

// The model block of a segment is a non-negative integer.
// expected-error @+1 {{'piper.block' must be a non-negative integer, got -1 : i64}}
piper.segment @s() attributes {piper.block = -1 : i64} {
  piper.yield
}

// -----

// The recompute region of a forward op is a non-negative integer.
piper.segment @s(%x: tensor<2xf32>) -> tensor<2xf32> {
  // expected-error @+1 {{'piper.recompute' must be a non-negative integer, got "full"}}
  %y = piper.gelu %x {piper.recompute = "full"} : tensor<2xf32>
  piper.yield %y : tensor<2xf32>
}

// -----

// Discardable piper attributes are declared by the dialect.
// expected-error @+1 {{unknown piper attribute 'piper.stage'}}
piper.segment @s() attributes {piper.stage = 0 : i64} {
  piper.yield
}

// -----

// Optimizer settings are known keys with typed values (#piper.optimizer).
// expected-error @+1 {{duplicate or unknown struct parameter name: momentum}}
piper.program @p attributes {optimizer = #piper.optimizer<momentum = 0.9>} {
}

// -----

// The compute dtype is f32 or bf16.
// expected-error @+2 {{expected one of [f32, bf16] for the element type a step computes in, got: f16}}
// expected-error @+1 {{failed to parse Piper_OptimizerAttr parameter 'dtype' which is to be a `ComputeType`}}
piper.program @p attributes {optimizer = #piper.optimizer<dtype = f16>} {
}

// -----

// Schedules, steps and the clipping threshold are non-negative.
// expected-error @+1 {{optimizer settings must be non-negative, got min_lr = 0.000000e+00, warmup_steps = -1, decay_steps = 0, clip_grad_norm = 0.000000e+00}}
piper.program @p attributes {optimizer = #piper.optimizer<warmup_steps = -1>} {
}

// -----

// A piper.program's optimizer is a #piper.optimizer, not a dictionary.
// expected-error @+1 {{'piper.program' op attribute 'optimizer' failed to satisfy constraint}}
piper.program @p attributes {optimizer = {clip_grad_norm = 0.5 : f64}} {
}

// -----

// Device programs count microbatches from one.
// expected-error @+1 {{'piper.device_program' op num_microbatches and num_replicas must be positive}}
piper.device_program @c attributes {device_class = 0 : i64, num_microbatches = 0 : i64, ranks = array<i64: 0>} {
}

// -----

// A collective id is non-negative.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0>} {
  // expected-error @+1 {{'piper.all_reduce' op collective id must be non-negative, got -1}}
  %d = piper.all_reduce grads [@w] {collective = -1 : i64, devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
}

// -----

//===----------------------------------------------------------------------===//
// Streams
//===----------------------------------------------------------------------===//

// A stream has a name.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+1 {{a stream needs a name}}
  %y, %d = piper.transfer %tok {from = #piper.group<0>, to = #piper.group<1>, stream = #piper.stream<"", comm>} : tensor<2x2xi32>
}

// -----

// A stream's kind is compute or comm.
piper.program @p {
  %tok, %tgt, %bd = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
  // expected-error @+2 {{expected ::mlir::piper::StreamKind to be one of: compute, comm}}
  // expected-error @+1 {{failed to parse Piper_StreamAttr parameter 'kind'}}
  %y, %d = piper.transfer %tok {from = #piper.group<0>, to = #piper.group<1>, stream = #piper.stream<"pp_stream", network>} : tensor<2x2xi32>
}

// -----

// Tasks run kernels: their stream is a compute stream.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op runs kernels, so its stream must be a compute stream, not 'pp_stream' (comm)}}
  %d = piper.task @s() {devices = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>, tag = #piper.tag<>} : () -> !piper.token
}

// -----

// One stream name, one kind: a task's send stream may not be the compute
// stream declared as a comm stream.
piper.segment @s() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op uses stream 'compute' (comm), but a 'piper.task' node uses it as a compute stream: a stream has one kind}}
  %d = piper.task @s() {devices = #piper.group<0>, send_stream = #piper.stream<"compute", comm>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<>} : () -> !piper.token
}

// -----

// One stream name, one kind, across the nodes of a device program.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.device_program @c attributes {device_class = 0 : i64, ranks = array<i64: 0, 1>} {
  %a = piper.all_reduce grads [@w] {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<>}
  // expected-error @+1 {{'piper.all_reduce' op uses stream 'dp_stream' (compute), but a 'piper.all_reduce' node uses it as a comm stream: a stream has one kind}}
  %b = piper.all_reduce grads [@w] {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", compute>, tag = #piper.tag<>}
}

