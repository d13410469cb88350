// piper-apply-strategy: a JSON strategy applied to a forward model, in
// phase order: stage, build-training-dag, split, place (and transfers),
// replicate, order. Errors name the directive by index and text.
// RUN: piper-opt %s -piper-apply-strategy="file=%S/Inputs/pp2.json" | FileCheck %s
// RUN: piper-opt %s -piper-apply-strategy="file=%S/Inputs/pp2dp2.json" | FileCheck %s --check-prefix=DP
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/pp2dp2.json world-size=2" 2>&1 | FileCheck %s --check-prefix=WORLD
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/order-cycle.json" 2>&1 | FileCheck %s --check-prefix=CYCLE
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/order-two-groups.json" 2>&1 | FileCheck %s --check-prefix=TWO-GROUPS
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/order-no-match.json" 2>&1 | FileCheck %s --check-prefix=NO-MATCH
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/unplaced.json" 2>&1 | FileCheck %s --check-prefix=UNPLACED
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/idle.json" 2>&1 | FileCheck %s --check-prefix=IDLE
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/two-stages.json" 2>&1 | FileCheck %s --check-prefix=TWO-STAGES
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/two-splits.json" 2>&1 | FileCheck %s --check-prefix=TWO-SPLITS
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/unknown-directive.json" 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not piper-opt %s -piper-apply-strategy="file=%S/Inputs/does-not-exist.json" 2>&1 | FileCheck %s --check-prefix=NO-FILE

// Two stages on devices 0 and 1, two microbatches, and an order that runs
// both forwards of stage 0 before its backwards (B0 then B1).
// CHECK-LABEL: piper.program @model attributes {num_microbatches = 2 : i64, {{.*}}} {
// CHECK: [[F0:%[^:]+]]:3, [[F0D:%[^ ]+]] = piper.task @stage0_F({{.*}}) {devices = #piper.group<0>, send_stream = #piper.stream<"pp_stream", comm>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>}
// CHECK-NEXT: [[A0:%[^,]+]], %{{.*}} = piper.transfer [[F0]]#0 {from = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<1>}
// CHECK-NEXT: piper.task @stage1_F([[A0]], {{.*}}) {devices = #piper.group<1>, send_stream = #piper.stream<"p2p", comm>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = F>}
// CHECK: [[F1:%[^:]+]]:3, [[F1D:%[^ ]+]] = piper.task @stage0_F({{.*}}) {devices = #piper.group<0>{{.*}}tag = #piper.tag<PP = 0, MB = 1, PASS = F>}
// CHECK: [[G0:%[^,]+]], %{{.*}} = piper.transfer %{{.*}} {from = #piper.group<1>, stream = #piper.stream<"p2p", comm>, to = #piper.group<0>}
// CHECK-NEXT: [[B0D:%.*]] = piper.task @stage0_B([[G0]], [[F0]]#1, [[F0]]#2, {{.*}}) after([[F0D]], [[F1D]]) {devices = #piper.group<0>{{.*}}MB = 0, PASS = B
// CHECK: piper.task @stage0_B({{.*}}) after([[B0D]]) {devices = #piper.group<0>{{.*}}MB = 1, PASS = B
// CHECK: piper.task @stage0_U() after
// CHECK: piper.task @stage1_U() after

// The object form with a world size: without a stage directive the places
// name two stages; each is replicated over two devices, stage 0 in buckets.
// DP-LABEL: piper.program @model attributes {num_replicas = 2 : i64, {{.*}}replicated} {
// DP: piper.task @stage0_F({{.*}}) {devices = #piper.group<0, 1>
// DP: piper.transfer {{.*}} {from = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<2, 3>}
// DP: [[B1:%[^ ]+]] = piper.task @stage1_B({{.*}}) {devices = #piper.group<2, 3>
// DP-NEXT: [[AR1:%.*]] = piper.all_reduce grads [@lm] after([[B1]]) {devices = #piper.group<2, 3>, stream = #piper.stream<"ar", comm>, tag = #piper.tag<PP = 1>}
// DP: [[B0:%[^ ]+]] = piper.task @stage0_B({{.*}}) {devices = #piper.group<0, 1>
// DP-NEXT: [[AR0A:%.*]] = piper.all_reduce grads [@b1, @w1] after([[B0]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// DP-NEXT: [[AR0B:%.*]] = piper.all_reduce grads [@wte] after([[B0]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// DP-NEXT: piper.task @stage0_U() after([[B0]], [[AR0A]], [[AR0B]])
// DP-NEXT: piper.task @stage1_U() after([[B1]], [[AR1]])

// The world-size option overrides the file's: device 2 does not exist.
// WORLD: error: directive #1 ({"devices":[2,3],"filter":{"PP":1},"op":"place"}): device 2 does not exist (the world has 2 devices, 0..1)

// An order that puts stage 0's backward before its forward.
// CYCLE: error: 'piper.program' op directive #3 ({"filters":{{\[\[}}{"PASS":"B","PP":0}],[{"PASS":"F","PP":0}]],"op":"order"}): the order contradicts the dataflow and creates a cycle:
// CYCLE-SAME: task @stage0_B (PP=0 MB=0 PASS=B) -> task @stage0_F (PP=0 MB=0 PASS=F)

// An order across two device groups.
// TWO-GROUPS: error: 'piper.task' op directive #3 ({"filters":{{\[\[}}{"PASS":"F","PP":0}],[{"PASS":"F","PP":1}]],"op":"order"}): an order directive must cover one device group, but task @stage0_F (PP=0 MB=0 PASS=F) runs on [0] and task @stage1_F (PP=1 MB=0 PASS=F) on [1]

// An order group that matches nothing.
// NO-MATCH: error: 'piper.program' op directive #0 ({"filters":{{\[\[}}{"PASS":"F","PP":0}],[{"PASS":"F","PP":3}]],"op":"order"}): group 1 [{"PASS": "F", "PP": 3}] matches no task

// Two stages but only stage 0 placed.
// UNPLACED: error: 'piper.task' op task @stage1_F (PP=1 MB=0 PASS=F) is not placed by any place directive

// A declared world larger than the placements.
// IDLE: error: 'piper.program' op devices [2] of the 3-device world run no task

// One stage directive and one split directive at most.
// TWO-STAGES: error: directive #1 ({"op":"stage","stages":3}): only one stage directive is allowed
// TWO-SPLITS: error: directive #1 ({"num_microbatches":4,"op":"split"}): only one split directive is allowed

// Strategy parse errors surface as pass errors.
// UNKNOWN: error: {{.*}}unknown-directive.json: directive #0 ({"op":"pipeline","stages":2}): unknown directive "pipeline" (expected stage, split, place, replicate, shard, order, schedule, recompute, shard_tensor or context_parallel)

// A missing file.
// NO-FILE: error: strategy file '{{.*}}does-not-exist.json': cannot open: no such file or directory

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
