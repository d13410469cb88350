// piper-replicate: data parallelism for one stage. Its gradients are summed
// over its device group by piper.all_reduce buckets (in gradient-ready
// order) after the stage's last backward and before its update.
// Inputs/dag.mlir is split into two microbatches and placed on [0, 1] and
// [2, 3] first.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 bucket-mb=0.0002" | FileCheck %s --check-prefix=BUCKETS
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 bucket-mb=0.00001" | FileCheck %s --check-prefix=TINY
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1" -piper-replicate="pp=1 devices=2,3 reduce-stream=ar" | FileCheck %s --check-prefix=BOTH
// RUN: piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0" -piper-place="pp=1 devices=1" \
// RUN:   -piper-replicate="pp=0 devices=0" | FileCheck %s --check-prefix=SINGLE
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-replicate="pp=0 devices=0,1" 2>&1 | FileCheck %s --check-prefix=UNPLACED
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=2,3" 2>&1 | FileCheck %s --check-prefix=ELSEWHERE
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=1,2" 2>&1 | FileCheck %s --check-prefix=OVERLAP
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=7 devices=0,1" 2>&1 | FileCheck %s --check-prefix=NO-TASK
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-replicate="pp=0 devices=0,1" | FileCheck %s --check-prefix=CHUNK

// Buckets of about 200 bytes: b1 (16 B) and w1 (64 B) share one, wte
// (256 B) gets its own. Both wait for both backwards of stage 0; the update
// waits for both buckets.
// BUCKETS-LABEL: piper.program @model attributes {num_microbatches = 2 : i64, num_replicas = 2 : i64, replicated} {
// BUCKETS: [[B0:%.*]] = piper.task @stage0_B({{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>
// BUCKETS: [[B1:%.*]] = piper.task @stage0_B({{.*}}tag = #piper.tag<PP = 0, MB = 1, PASS = B>
// BUCKETS-NEXT: [[AR0:%.*]] = piper.all_reduce grads [@b1, @w1] after([[B0]], [[B1]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// BUCKETS-NEXT: [[AR1:%.*]] = piper.all_reduce grads [@wte] after([[B0]], [[B1]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// BUCKETS-NEXT: piper.task @stage0_U() after([[B0]], [[B1]], [[AR0]], [[AR1]])
// BUCKETS-NOT: piper.all_reduce

// Buckets smaller than any parameter: one all-reduce per parameter.
// TINY-LABEL: piper.program @model
// TINY: piper.all_reduce grads [@b1] after
// TINY-NEXT: piper.all_reduce grads [@w1] after
// TINY-NEXT: piper.all_reduce grads [@wte] after
// TINY-NOT: piper.all_reduce

// The default 25 MB bucket holds a stage's gradients; each stage reduces
// over its own group on the stream the option names.
// BOTH-LABEL: piper.program @model attributes {num_microbatches = 2 : i64, num_replicas = 2 : i64, replicated} {
// BOTH: [[B10:%[^,]+]], [[B10D:%[^ ]+]] = piper.task @stage1_B({{.*}}MB = 0
// BOTH: [[B11:%[^,]+]], [[B11D:%[^ ]+]] = piper.task @stage1_B({{.*}}MB = 1
// BOTH-NEXT: [[AR1:%.*]] = piper.all_reduce grads [@lm] after([[B10D]], [[B11D]]) {devices = #piper.group<2, 3>, stream = #piper.stream<"ar", comm>, tag = #piper.tag<PP = 1>}
// BOTH: [[AR0:%.*]] = piper.all_reduce grads [@b1, @w1, @wte] after({{.*}}) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// BOTH-NEXT: piper.task @stage0_U() after({{.*}}, [[AR0]])
// BOTH-NEXT: piper.task @stage1_U() after([[B10D]], [[B11D]], [[AR1]])

// One replica needs no reduction; the program is marked replicated with the
// default degree 1.
// SINGLE-LABEL: piper.program @model attributes {replicated} {
// SINGLE-NOT: piper.all_reduce

// The stage must be placed on the replicated devices first.
// UNPLACED: error: 'piper.task' op directive #0 (piper-replicate pp=0): task @stage0_F (PP=0 PASS=F) runs on no device, not on [0, 1]; place it on the replicated devices first

// ... on exactly those devices. A task on a group disjoint from them is
// another copy's (DualPipe replicates each copy on its own group): some
// task must run on the replicated devices.
// ELSEWHERE: error: 'piper.program' op directive #0 (piper-replicate pp=0): no task of the filter runs on [2, 3]; place it on the replicated devices first
// OVERLAP: error: 'piper.task' op directive #0 (piper-replicate pp=0): task @stage0_F (PP=0 PASS=F) runs on [0, 1], not on [1, 2]; place it on the replicated devices first

// The stage must exist.
// NO-TASK: error: 'piper.program' op directive #0 (piper-replicate pp=7): the filter matches no task

// Every update of a reduced parameter waits for the reduction, whichever
// stage it is tagged with; an update of other parameters does not.
// CHUNK-LABEL: piper.program @updates
// CHUNK: [[B:%.*]] = piper.task @bwd() {devices = #piper.group<0, 1>
// CHUNK-NEXT: [[AR:%.*]] = piper.all_reduce grads [@w] after([[B]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// CHUNK-NEXT: piper.task @upd_w() after([[AR]]) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 1, PASS = U>}
// CHUNK-NEXT: piper.task @upd_v() {devices = #piper.group<2, 3>, tag = #piper.tag<PP = 1, PASS = U>}
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.param @v : tensor<4xf32> init zeros(0.0)
piper.segment @bwd() {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.accumulate_grad @w, %w : tensor<4xf32>
  piper.yield
}
piper.segment @upd_w() {
  piper.adamw @w {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  piper.yield
}
piper.segment @upd_v() {
  piper.adamw @v {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  piper.yield
}
piper.program @updates {
  %b = piper.task @bwd() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = B>} : () -> !piper.token
  %u = piper.task @upd_w() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
  %v = piper.task @upd_v() {devices = #piper.group<2, 3>, tag = #piper.tag<PP = 1, PASS = U>} : () -> !piper.token
}

// -----

// Every replicate has the same data-parallel degree.
piper.segment @f() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op directive #0 (piper-replicate pp=0): data-parallel degree 2 differs from the degree 3 of an earlier replicate}}
piper.program @p attributes {num_replicas = 3 : i64, replicated} {
  %d0 = piper.task @f() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = F>} : () -> !piper.token
  %d1 = piper.task @f() {devices = #piper.group<2, 3, 4>, tag = #piper.tag<PP = 1, PASS = F>} : () -> !piper.token
}
