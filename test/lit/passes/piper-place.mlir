// piper-place: puts the tasks of one stage on a device group; once every
// task is placed, a piper.transfer goes on each data edge between groups.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0,1" | FileCheck %s --check-prefix=HALF
// RUN: piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3 stream=p2p" | FileCheck %s --check-prefix=BOTH
// RUN: piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0" -piper-place="pp=1 devices=0" -piper-place="pp=1 devices=0" | FileCheck %s --check-prefix=SAME
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0" -piper-place="pp=0 devices=1" 2>&1 | FileCheck %s --check-prefix=OVERLAP
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=5 devices=0" 2>&1 | FileCheck %s --check-prefix=NO-TASK
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0" 2>&1 | FileCheck %s --check-prefix=NO-DEVICES
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0" -piper-place="pp=1 devices=1,2" 2>&1 | FileCheck %s --check-prefix=SIZES
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-place="pp=0 devices=0" -piper-place="pp=1 devices=2" 2>&1 | FileCheck %s --check-prefix=IDLE
// RUN: piper-opt %s -split-input-file -verify-diagnostics -piper-place="pp=0 devices=0" | FileCheck %s --check-prefix=CHUNK

// One stage placed: its tasks get the group and the compute stream, the
// other stage's tasks stay unplaced, and there are no transfers yet.
// HALF-LABEL: piper.program @model {
// HALF-NOT: piper.transfer
// HALF: piper.task @stage0_F({{.*}}) {devices = #piper.group<0, 1>, send_stream = #piper.stream<"pp_stream", comm>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = F>}
// HALF: piper.task @stage1_F({{.*}}) {tag = #piper.tag<PP = 1, PASS = F>}
// HALF: piper.task @stage1_B({{.*}}) {tag = #piper.tag<PP = 1, PASS = B>}
// HALF: piper.task @stage0_B({{.*}}) {devices = #piper.group<0, 1>, send_stream = #piper.stream<"pp_stream", comm>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = B>}
// HALF: piper.task @stage0_U() {{.*}}devices = #piper.group<0, 1>
// HALF: piper.task @stage1_U() after(%{{.*}}) {tag = #piper.tag<PP = 1, PASS = U>}
// HALF-NOT: piper.transfer

// Both stages placed: the activation crosses from [0, 1] to [2, 3] once,
// right after its producer, and both of stage 1's tasks read the moved
// value; the gradient crosses back on the stream of its sender's place.
// BOTH-LABEL: piper.program @model {
// BOTH-NEXT: [[TOK:%[^,]+]], [[TGT:%[^,]+]], %{{.*}} = piper.batch
// BOTH-NEXT: [[F0:%[^:]+]]:3, %{{.*}} = piper.task @stage0_F([[TOK]]) {devices = #piper.group<0, 1>
// BOTH-NEXT: [[ACT:%[^,]+]], %{{.*}} = piper.transfer [[F0]]#0 {from = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<2, 3>} : tensor<4x4xf32>
// BOTH-NEXT: [[F1:%[^,]+]], %{{.*}} = piper.task @stage1_F([[ACT]], [[TGT]]) {devices = #piper.group<2, 3>, send_stream = #piper.stream<"p2p", comm>, stream = #piper.stream<"compute", compute>
// BOTH-NEXT: [[B1:%[^,]+]], %{{.*}} = piper.task @stage1_B([[TGT]], [[F1]], [[ACT]]) {devices = #piper.group<2, 3>
// BOTH-NEXT: [[GRAD:%[^,]+]], %{{.*}} = piper.transfer [[B1]] {from = #piper.group<2, 3>, stream = #piper.stream<"p2p", comm>, to = #piper.group<0, 1>} : tensor<4x4xf32>
// BOTH-NEXT: piper.task @stage0_B([[GRAD]], [[F0]]#1, [[F0]]#2, [[TOK]]) {devices = #piper.group<0, 1>
// BOTH-NEXT: piper.task @stage0_U() {{.*}}devices = #piper.group<0, 1>
// BOTH-NEXT: piper.task @stage1_U() {{.*}}devices = #piper.group<2, 3>
// BOTH-NEXT: {{^ *}}}{{$}}

// Both stages on one device need no transfer; placing a stage twice on the
// same group is harmless.
// SAME-LABEL: piper.program @model {
// SAME-NOT: piper.transfer
// SAME-COUNT-6: devices = #piper.group<0>
// SAME-NOT: piper.transfer
// SAME: }

// A stage placed twice on different groups.
// OVERLAP: error: 'piper.task' op directive #0 (piper-place pp=0): overlapping placements: task @stage0_F (PP=0 PASS=F) is already placed on [0]

// A stage that does not exist.
// NO-TASK: error: 'piper.program' op directive #0 (piper-place pp=5): the filter matches no task

// The device group is required (the one verifier of directives says so).
// NO-DEVICES: error: directive #0 (piper-place pp=0): "devices" must be a non-empty list of device indices

// Member i of one group sends to member i of the other: sizes must agree.
// SIZES: error: 'piper.task' op task @stage1_F (PP=1 PASS=F) on [1, 2] consumes a value of task @stage0_F (PP=0 PASS=F) on [0]; transfers need device groups of the same size

// Devices 0..max must all run something.
// IDLE: error: 'piper.program' op devices [1] of the 3-device world run no task

// Placing the last unplaced stage inserts the transfers.
// CHUNK-LABEL: piper.program @last
// CHUNK-NEXT: [[X:%[^,]+]], %{{.*}} = piper.task @f() {devices = #piper.group<0>, send_stream = #piper.stream<"pp_stream", comm>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 0, PASS = F>}
// CHUNK-NEXT: [[MOVED:%[^,]+]], %{{.*}} = piper.transfer [[X]] {from = #piper.group<0>, stream = #piper.stream<"pp_stream", comm>, to = #piper.group<1>} : tensor<4xf32>
// CHUNK-NEXT: piper.task @g([[MOVED]]) {devices = #piper.group<1>, tag = #piper.tag<PP = 1, PASS = F>}
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @f() -> tensor<4xf32> {
  %x = piper.param_ref @w : tensor<4xf32>
  piper.yield %x : tensor<4xf32>
}
piper.segment @g(%x: tensor<4xf32>) {
  piper.yield
}
piper.program @last {
  %x, %d0 = piper.task @f() {tag = #piper.tag<PP = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %d1 = piper.task @g(%x) {devices = #piper.group<1>, tag = #piper.tag<PP = 1, PASS = F>} : (tensor<4xf32>) -> !piper.token
}

// -----

// A task that already runs elsewhere cannot be placed again.
piper.segment @f() {
  piper.yield
}
piper.program @p {
  // expected-error @+1 {{'piper.task' op directive #0 (piper-place pp=0): overlapping placements: task @f (PP=0 MB=1 PASS=F) is already placed on [5]}}
  %d = piper.task @f() {devices = #piper.group<5>, tag = #piper.tag<PP = 0, MB = 1, PASS = F>} : () -> !piper.token
}

// -----

// The filter {"PP": 0} must match a task.
piper.segment @f() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op directive #0 (piper-place pp=0): the filter matches no task}}
piper.program @p {
  %d = piper.task @f() {tag = #piper.tag<PP = 1, PASS = F>} : () -> !piper.token
}

// -----

// Device groups of different sizes cannot exchange tensors.
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @f() -> tensor<4xf32> {
  %x = piper.param_ref @w : tensor<4xf32>
  piper.yield %x : tensor<4xf32>
}
piper.segment @g(%x: tensor<4xf32>) {
  piper.yield
}
piper.program @p {
  %x, %d0 = piper.task @f() {tag = #piper.tag<PP = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  // expected-error @+1 {{'piper.task' op task @g (PP=1 PASS=F) on [1, 2] consumes a value of task @f (PP=0 PASS=F) on [0]; transfers need device groups of the same size}}
  %d1 = piper.task @g(%x) {devices = #piper.group<1, 2>, tag = #piper.tag<PP = 1, PASS = F>} : (tensor<4xf32>) -> !piper.token
}

// -----

// Device 1 runs nothing while devices 0 and 2 work.
piper.segment @f() {
  piper.yield
}
// expected-error @+1 {{'piper.program' op devices [1] of the 3-device world run no task}}
piper.program @p {
  %d0 = piper.task @f() {tag = #piper.tag<PP = 0, PASS = F>} : () -> !piper.token
  %d1 = piper.task @f() {devices = #piper.group<2>, tag = #piper.tag<PP = 1, PASS = F>} : () -> !piper.token
}

// -----

// Token edges only order: a dependence across groups needs no transfer.
// CHUNK-LABEL: piper.program @tokens
// CHUNK-NEXT: %{{.*}}, [[D0:%[^ ]+]] = piper.task @f() {devices = #piper.group<0>
// CHUNK-NEXT: piper.task @h() after([[D0]]) {devices = #piper.group<1>
// CHUNK-NOT: piper.transfer
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.segment @f() -> tensor<4xf32> {
  %x = piper.param_ref @w : tensor<4xf32>
  piper.yield %x : tensor<4xf32>
}
piper.segment @h() {
  piper.yield
}
piper.program @tokens {
  %x, %d0 = piper.task @f() {tag = #piper.tag<PP = 0, PASS = F>} : () -> (tensor<4xf32>, !piper.token)
  %d1 = piper.task @h() after(%d0) {devices = #piper.group<1>, tag = #piper.tag<PP = 1, PASS = F>} : () -> !piper.token
}
