// piper-stage: contiguous model blocks become pipeline stages, balanced by
// estimated FLOPs; each group's segments merge into one @stageN segment.
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-stage=stages=2 | FileCheck %s
// RUN: piper-opt %S/Inputs/model.mlir -piper-stage | FileCheck %s --check-prefix=ONE
// RUN: piper-opt %S/Inputs/model.mlir -piper-stage=stages=3 | FileCheck %s --check-prefix=THREE
// RUN: not piper-opt %S/Inputs/model.mlir -piper-stage=stages=4 2>&1 | FileCheck %s --check-prefix=TOO-MANY
// RUN: not piper-opt %S/Inputs/model.mlir -piper-stage=stages=0 2>&1 | FileCheck %s --check-prefix=ZERO

// The default is one stage: the whole model in @stage0, whose inputs are
// the tokens and the targets and whose output is the loss.
// ONE-NOT: @embed
// ONE-LABEL: piper.segment @stage0(
// ONE-SAME: [[IDS:%[^:]+]]: tensor<2x2xi32>, [[TGT:%[^:]+]]: tensor<2x2xi32>) -> tensor<f32> {
// ONE: piper.embedding [[IDS]]
// ONE: piper.cross_entropy %{{.*}}, [[TGT]]
// ONE-NOT: piper.segment
// ONE-LABEL: piper.program @model
// ONE-NEXT: [[TOK:%[^,]+]], [[TGT:%[^,]+]], %{{.*}} = piper.batch
// ONE-NEXT: piper.task @stage0([[TOK]], [[TGT]]) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
// ONE-NEXT: {{^ *}}}{{$}}

// Three stages from three blocks: one block each, chained in order.
// THREE-LABEL: piper.segment @stage0(%{{.*}}: tensor<2x2xi32>) -> tensor<4x4xf32>
// THREE: piper.embedding
// THREE-LABEL: piper.segment @stage1(%{{.*}}: tensor<4x4xf32>) -> tensor<4x4xf32>
// THREE: piper.linear
// THREE: piper.gelu
// THREE-LABEL: piper.segment @stage2(%{{.*}}: tensor<4x4xf32>, %{{.*}}: tensor<2x2xi32>) -> tensor<f32>
// THREE: piper.cross_entropy
// THREE-LABEL: piper.program @model
// THREE: [[TOK:%[^,]+]], [[TGT:%[^,]+]], %{{.*}} = piper.batch
// THREE: [[X0:%[^,]+]], %{{.*}} = piper.task @stage0([[TOK]]) {tag = #piper.tag<PP = 0>}
// THREE: [[X1:%[^,]+]], %{{.*}} = piper.task @stage1([[X0]]) {tag = #piper.tag<PP = 1>}
// THREE: piper.task @stage2([[X1]], [[TGT]]) {tag = #piper.tag<PP = 2>}

// More stages than blocks is an error.
// TOO-MANY: error: 'piper.program' op cannot make 4 pipeline stages from 3 model blocks

// So is no stage at all.
// ZERO: error: 'piper.program' op cannot make 0 pipeline stages from 3 model blocks

// Two stages of the three-block model: embed and block0 cost less than the
// head (its vocabulary projection), so the cut falls before the head. The
// merged segment chains the blocks' bodies; the old segments are gone.
// CHECK-LABEL: module {
// CHECK-NOT: @embed
// CHECK-NOT: @block0
// CHECK-LABEL: piper.segment @stage0(
// CHECK-SAME: [[IDS:%[^:]+]]: tensor<2x2xi32>) -> tensor<4x4xf32> {
// CHECK: [[WTE:%.*]] = piper.param_ref @wte
// CHECK: [[EMB:%.*]] = piper.embedding [[IDS]], [[WTE]]
// CHECK: [[W1:%.*]] = piper.param_ref @w1
// CHECK: [[B1:%.*]] = piper.param_ref @b1
// CHECK: [[LIN:%.*]] = piper.linear [[EMB]], [[W1]], [[B1]]
// CHECK: [[GELU:%.*]] = piper.gelu [[LIN]]
// CHECK: piper.yield [[GELU]] : tensor<4x4xf32>
// CHECK-LABEL: piper.segment @stage1(
// CHECK-SAME: [[X:%[^:]+]]: tensor<4x4xf32>, [[T:%[^:]+]]: tensor<2x2xi32>) -> tensor<f32> {
// CHECK: [[LOGITS:%.*]] = piper.linear [[X]]
// CHECK: [[LOSS:%.*]] = piper.cross_entropy [[LOGITS]], [[T]]
// CHECK: piper.yield [[LOSS]] : tensor<f32>
// CHECK-NOT: @head
// CHECK-LABEL: piper.program @model
// CHECK: [[TOK:%[^,]+]], [[TGT:%[^,]+]], %{{.*}} = piper.batch
// CHECK: [[ACT:%[^,]+]], %{{.*}} = piper.task @stage0([[TOK]]) {tag = #piper.tag<PP = 0>} : (tensor<2x2xi32>) -> (tensor<4x4xf32>, !piper.token)
// CHECK: piper.task @stage1([[ACT]], [[TGT]]) {tag = #piper.tag<PP = 1>} : (tensor<4x4xf32>, tensor<2x2xi32>) -> (tensor<f32>, !piper.token)
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

// -----

// Balancing: a heavy first block gets a stage of its own and the two light
// blocks share the second, whatever their order in the module.
// CHECK-LABEL: module {
// CHECK-LABEL: piper.segment @stage0() {
// CHECK-NEXT: piper.param_ref @big : tensor<64x64xf32>
// CHECK-NEXT: piper.yield
// CHECK-LABEL: piper.segment @stage1() {
// CHECK-NEXT: piper.param_ref @small : tensor<4x4xf32>
// CHECK-NEXT: piper.param_ref @small : tensor<4x4xf32>
// CHECK-NEXT: piper.yield
// CHECK-LABEL: piper.program @balance
// CHECK-NEXT: piper.task @stage0() {tag = #piper.tag<PP = 0>}
// CHECK-NEXT: piper.task @stage1() {tag = #piper.tag<PP = 1>}
// CHECK-NEXT: {{^ *}}}{{$}}
module {
  piper.param @big : tensor<64x64xf32> init zeros(0.0)
  piper.param @small : tensor<4x4xf32> init zeros(0.0)
  piper.segment @light1() {
    %w = piper.param_ref @small : tensor<4x4xf32>
    piper.yield
  }
  piper.segment @heavy() {
    %w = piper.param_ref @big : tensor<64x64xf32>
    piper.yield
  }
  piper.segment @light2() {
    %w = piper.param_ref @small : tensor<4x4xf32>
    piper.yield
  }
  piper.program @balance {
    %d0 = piper.task @heavy() {tag = #piper.tag<block = 0>} : () -> !piper.token
    %d1 = piper.task @light1() {tag = #piper.tag<block = 1>} : () -> !piper.token
    %d2 = piper.task @light2() {tag = #piper.tag<block = 2>} : () -> !piper.token
  }
}

// -----

// Two stages need at least two blocks.
piper.segment @only() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op cannot make 2 pipeline stages from 1 model blocks}}
piper.program @p {
  %d = piper.task @only() {tag = #piper.tag<block = 0>} : () -> !piper.token
}

// -----

// Staging twice: tasks already carry a PP tag.
piper.segment @stage0() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op stage expects forward model tasks tagged with 'block' only, got #piper.tag<PP = 0>}}
  %d = piper.task @stage0() {tag = #piper.tag<PP = 0>} : () -> !piper.token
}

// -----

// Staging a training DAG: tasks carry a PASS tag.
piper.segment @b() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op stage expects forward model tasks tagged with 'block' only, got #piper.tag<PASS = F, block = 0>}}
  %d = piper.task @b() {tag = #piper.tag<PASS = F, block = 0>} : () -> !piper.token
}

// -----

// A program without tasks has nothing to stage.
// expected-error @+1 {{'piper.program' op has no tasks to stage}}
piper.program @p {
  %tok, %tgt, %d = piper.batch {tag = #piper.tag<>} : tensor<2x2xi32>, tensor<2x2xi32>
}

// -----

// The module needs a program.
// expected-error @+1 {{module has no piper.program}}
module {
  piper.param @w : tensor<4xf32> init zeros(0.0)
}

// -----

// The module needs exactly one program.
piper.program @p {
}
// expected-error @+1 {{'piper.program' op a module must hold exactly one piper.program}}
piper.program @q {
}
