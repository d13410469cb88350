// piper-schedule: orders every stage's forward and backward tasks by a
// pipeline schedule, as token edges (`after`) between consecutive tasks of
// a stage; the block is re-sorted to follow them.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=3 -piper-schedule | FileCheck %s --check-prefix=1F1B
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=3 -piper-schedule=schedule=gpipe | FileCheck %s --check-prefix=GPIPE
// RUN: piper-opt %S/Inputs/model.mlir -piper-stage=stages=3 -piper-build-training-dag -piper-split=microbatches=4 \
// RUN:   -piper-schedule=schedule=1f1b | FileCheck %s --check-prefix=WARMUP
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-split -piper-schedule=schedule=zb 2>&1 | FileCheck %s --check-prefix=UNKNOWN
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-schedule 2>&1 | FileCheck %s --check-prefix=UNSPLIT
// RUN: not piper-opt %S/Inputs/model.mlir -piper-stage=stages=3 -piper-build-training-dag -piper-split=microbatches=4 \
// RUN:   -piper-schedule=schedule=zbv 2>&1 | FileCheck %s --check-prefix=V-ODD
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-schedule=schedule=gpipe

// 1F1B with two stages and three microbatches. The last stage alternates
// from the start: F0 B0 F1 B1 F2 B2. Stage 0 warms up with one forward:
// F0 F1 B0 F2 B1 B2. Each task waits on the one before it in its stage.
// 1F1B-LABEL: piper.program @model attributes {num_microbatches = 3 : i64} {
// 1F1B: [[S0F0:%[^ ]+]] = piper.task @stage0_F(%{{[^)]*}}) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>}
// 1F1B: [[S1F0:%[^ ]+]] = piper.task @stage1_F(%{{[^)]*}}) {tag = #piper.tag<PP = 1, MB = 0, PASS = F>}
// 1F1B: [[S0F1:%[^ ]+]] = piper.task @stage0_F(%{{[^)]*}}) after([[S0F0]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = F>}
// 1F1B: [[S1B0:%[^ ]+]] = piper.task @stage1_B({{.*}}) after([[S1F0]]) {tag = #piper.tag<PP = 1, MB = 0, PASS = B>}
// 1F1B: [[S1F1:%[^ ]+]] = piper.task @stage1_F({{.*}}) after([[S1B0]]) {tag = #piper.tag<PP = 1, MB = 1, PASS = F>}
// 1F1B: [[S0B0:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[S0F1]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = B>}
// 1F1B: [[S0F2:%[^ ]+]] = piper.task @stage0_F({{.*}}) after([[S0B0]]) {tag = #piper.tag<PP = 0, MB = 2, PASS = F>}
// 1F1B: [[S1B1:%[^ ]+]] = piper.task @stage1_B({{.*}}) after([[S1F1]]) {tag = #piper.tag<PP = 1, MB = 1, PASS = B>}
// 1F1B: [[S1F2:%[^ ]+]] = piper.task @stage1_F({{.*}}) after([[S1B1]]) {tag = #piper.tag<PP = 1, MB = 2, PASS = F>}
// 1F1B: [[S0B1:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[S0F2]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = B>}
// 1F1B: [[S1B2:%[^ ]+]] = piper.task @stage1_B({{.*}}) after([[S1F2]]) {tag = #piper.tag<PP = 1, MB = 2, PASS = B>}
// 1F1B: [[S0B2:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[S0B1]]) {tag = #piper.tag<PP = 0, MB = 2, PASS = B>}
// The updates keep their dependence on every backward of their stage.
// 1F1B: piper.task @stage0_U() after([[S0B0]], [[S0B1]], [[S0B2]])
// 1F1B: piper.task @stage1_U() after([[S1B0]], [[S1B1]], [[S1B2]])

// GPipe: every stage runs all forwards, then all backwards.
// GPIPE-LABEL: piper.program @model attributes {num_microbatches = 3 : i64} {
// GPIPE: [[S0F0:%[^ ]+]] = piper.task @stage0_F(%{{[^)]*}}) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>}
// GPIPE: [[S1F0:%[^ ]+]] = piper.task @stage1_F(%{{[^)]*}}) {tag = #piper.tag<PP = 1, MB = 0, PASS = F>}
// GPIPE: [[S0F1:%[^ ]+]] = piper.task @stage0_F({{.*}}) after([[S0F0]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = F>}
// GPIPE: [[S1F1:%[^ ]+]] = piper.task @stage1_F({{.*}}) after([[S1F0]]) {tag = #piper.tag<PP = 1, MB = 1, PASS = F>}
// GPIPE: [[S0F2:%[^ ]+]] = piper.task @stage0_F({{.*}}) after([[S0F1]]) {tag = #piper.tag<PP = 0, MB = 2, PASS = F>}
// GPIPE: [[S1F2:%[^ ]+]] = piper.task @stage1_F({{.*}}) after([[S1F1]]) {tag = #piper.tag<PP = 1, MB = 2, PASS = F>}
// GPIPE: [[S1B0:%[^ ]+]] = piper.task @stage1_B({{.*}}) after([[S1F2]]) {tag = #piper.tag<PP = 1, MB = 0, PASS = B>}
// GPIPE: [[S0B0:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[S0F2]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = B>}
// GPIPE: [[S1B1:%[^ ]+]] = piper.task @stage1_B({{.*}}) after([[S1B0]]) {tag = #piper.tag<PP = 1, MB = 1, PASS = B>}
// GPIPE: [[S0B1:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[S0B0]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = B>}
// GPIPE: [[S1B2:%[^ ]+]] = piper.task @stage1_B({{.*}}) after([[S1B1]]) {tag = #piper.tag<PP = 1, MB = 2, PASS = B>}
// GPIPE: [[S0B2:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[S0B1]]) {tag = #piper.tag<PP = 0, MB = 2, PASS = B>}

// 1F1B with three stages and four microbatches: stage 0 warms up with two
// forwards, F0 F1 F2 B0 F3 B1 B2 B3.
// WARMUP-LABEL: piper.program @model attributes {num_microbatches = 4 : i64{{.*}}} {
// WARMUP: [[F0:%[^ ]+]] = piper.task @stage0_F(%{{[^)]*}}) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>}
// WARMUP: [[F1:%[^ ]+]] = piper.task @stage0_F({{.*}}) after([[F0]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = F>}
// WARMUP: [[F2:%[^ ]+]] = piper.task @stage0_F({{.*}}) after([[F1]]) {tag = #piper.tag<PP = 0, MB = 2, PASS = F>}
// WARMUP: [[B0:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[F2]]) {tag = #piper.tag<PP = 0, MB = 0, PASS = B>}
// WARMUP: [[F3:%[^ ]+]] = piper.task @stage0_F({{.*}}) after([[B0]]) {tag = #piper.tag<PP = 0, MB = 3, PASS = F>}
// WARMUP: [[B1:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[F3]]) {tag = #piper.tag<PP = 0, MB = 1, PASS = B>}
// WARMUP: [[B2:%[^ ]+]] = piper.task @stage0_B({{.*}}) after([[B1]]) {tag = #piper.tag<PP = 0, MB = 2, PASS = B>}
// WARMUP: piper.task @stage0_B({{.*}}) after([[B2]]) {tag = #piper.tag<PP = 0, MB = 3, PASS = B>}

// Unknown names are refused with the registered ones.
// UNKNOWN: error: unknown schedule 'zb' (expected gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zbv, dualpipe, dualpipev)

// Unplaced stages take the schedule's layout, which for a V needs an even
// number of them.
// V-ODD: error: 'piper.program' op piper-schedule: schedule 'zbv' needs an even number of stages for its V layout (device group d holds stages d and 2P-1-d), got 3

// The schedule orders microbatches: the program must be split first.
// UNSPLIT: error: 'piper.task' op piper-schedule: task @{{[^ ]+}} ({{.*}}) has no MB tag: schedules order microbatches, run piper-split first

// An order directive covers one device group: two microbatches of one
// stage on different devices cannot be ordered.
piper.segment @f() {
  piper.yield
}
piper.program @p attributes {num_microbatches = 2 : i64} {
  %f0 = piper.task @f() {devices = #piper.group<0>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : () -> !piper.token
  // expected-error @+1 {{'piper.task' op directive #0 (order: gpipe schedule of pipeline group 0): an order directive must cover one device group, but task @f (PP=0 MB=0 PASS=F) runs on [0] and task @f (PP=0 MB=1 PASS=F) on [1]}}
  %f1 = piper.task @f() {devices = #piper.group<1>, tag = #piper.tag<PP = 0, MB = 1, PASS = F>} : () -> !piper.token
  %b0 = piper.task @f() {devices = #piper.group<0>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : () -> !piper.token
  %b1 = piper.task @f() {devices = #piper.group<1>, tag = #piper.tag<PP = 0, MB = 1, PASS = B>} : () -> !piper.token
}

// -----

// A schedule that contradicts the dataflow: microbatch 0's forward reads
// microbatch 1's, yet GPipe puts F0 first.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @src() -> tensor<4xf32> {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.yield %w : tensor<4xf32>
}
piper.segment @use(%x: tensor<4xf32>) {
  piper.yield
}
piper.segment @b() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op directive #0 (order: gpipe schedule of pipeline group 0): the order contradicts the dataflow and creates a cycle: task @use (PP=0 MB=0 PASS=F) -> task @src (PP=0 MB=1 PASS=F) -> task @use (PP=0 MB=0 PASS=F)}}
piper.program @p attributes {num_microbatches = 2 : i64} {
  %x, %f1 = piper.task @src() {tag = #piper.tag<PP = 0, MB = 1, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %f0 = piper.task @use(%x) {tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<4xf32>) -> !piper.token
  %b0 = piper.task @b() {tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : () -> !piper.token
  %b1 = piper.task @b() {tag = #piper.tag<PP = 0, MB = 1, PASS = B>} : () -> !piper.token
}
