// piper-replicate on two stages of one device group that accumulate the same
// parameter (a tied embedding whose first and last stages a V layout puts
// on one group): each rank has one accumulator for both stages, reduced
// once, after both stages' backwards, by the first replicate; the second
// leaves it out (issue 20). Stages sharing a parameter on one group must
// use the same ZeRO stage.
// RUN: piper-opt %s -piper-replicate="pp=0 devices=0,1" -piper-replicate="pp=3 devices=0,1" | FileCheck %s --check-prefix=ZERO0
// RUN: piper-opt %s -piper-replicate="pp=3 devices=0,1" -piper-replicate="pp=0 devices=0,1" | FileCheck %s --check-prefix=REVERSED
// RUN: piper-opt %s -piper-replicate="pp=0 devices=0,1 zero=1" -piper-replicate="pp=3 devices=0,1 zero=1" | FileCheck %s --check-prefix=ZERO1
// RUN: not piper-opt %s -piper-replicate="pp=0 devices=0,1" -piper-replicate="pp=3 devices=0,1 zero=1" 2>&1 | FileCheck %s --check-prefix=MIXED
// RUN: not piper-opt %s -piper-replicate="pp=0 devices=0,1 zero=2" -piper-replicate="pp=3 devices=0,1" 2>&1 | FileCheck %s --check-prefix=MIXED2

// ZERO0-LABEL: piper.program @model
// ZERO0: [[B3:%[^ ]+]] = piper.task @bwd3()
// ZERO0-NEXT: [[AL:%[^ ]+]] = piper.all_reduce grads [@lm] after([[B3]]) {{.*}}tag = #piper.tag<PP = 3>}
// ZERO0-NEXT: [[B0:%[^ ]+]] = piper.task @bwd0() after([[B3]])
// ZERO0-NEXT: [[AT:%[^ ]+]] = piper.all_reduce grads [@wte] after([[B3]], [[B0]]) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
// ZERO0-NEXT: [[AW:%[^ ]+]] = piper.all_reduce grads [@w] after([[B0]])
// ZERO0-NEXT: piper.task @upd0() after([[B0]], [[B3]], [[AW]], [[AT]])
// ZERO0-NEXT: piper.task @upd3() after([[B3]], [[AL]])
// ZERO0-NOT: piper.all_reduce

// REVERSED-LABEL: piper.program @model
// REVERSED: [[B3:%[^ ]+]] = piper.task @bwd3()
// REVERSED: [[B0:%[^ ]+]] = piper.task @bwd0()
// REVERSED-NEXT: piper.all_reduce grads [@w] after([[B0]])
// REVERSED-NEXT: piper.all_reduce grads [@wte] after([[B3]], [[B0]]) {{.*}}tag = #piper.tag<PP = 3>}
// REVERSED-NOT: piper.all_reduce

// ZeRO-1: one reduce-scatter of the colocated accumulator after both
// backwards, one gather after the update that keeps its AdamW step.
// ZERO1-LABEL: piper.program @model
// ZERO1: [[B3:%[^ ]+]] = piper.task @bwd3()
// ZERO1-NEXT: piper.reduce_scatter_grads [@lm] after([[B3]])
// ZERO1-NEXT: [[B0:%[^ ]+]] = piper.task @bwd0() after([[B3]])
// ZERO1-NEXT: [[RT:%[^ ]+]] = piper.reduce_scatter_grads [@wte] after([[B3]], [[B0]]) {{.*}}zero = 1 : i64}
// ZERO1-NEXT: [[RW:%[^ ]+]] = piper.reduce_scatter_grads [@w] after([[B0]])
// ZERO1-NEXT: [[U0:%[^ ]+]] = piper.task @upd0() after([[B0]], [[B3]], [[RW]], [[RT]])
// ZERO1-NEXT: piper.all_gather_params [@wte] after([[U0]])
// ZERO1-NEXT: piper.all_gather_params [@w] after([[U0]])
// ZERO1-NOT: piper.reduce_scatter_grads [@wte]
// ZERO1-NOT: piper.all_gather_params [@wte]

// MIXED: error: 'piper.program' op directive #0 (piper-replicate pp=3): parameter @wte is accumulated by several stages on [0, 1], replicated with ZeRO-0 and ZeRO-1; replicate the stages of one device group with the same ZeRO stage
// MIXED2: error: 'piper.program' op directive #0 (piper-replicate pp=3): parameter @wte is accumulated by several stages on [0, 1], replicated with ZeRO-2 and ZeRO-0; replicate the stages of one device group with the same ZeRO stage

piper.param @wte : tensor<4xf32> init zeros(0.0)
piper.param @w : tensor<4xf32> init zeros(0.0)
piper.param @lm : tensor<4xf32> init zeros(0.0)
piper.segment @bwd3() {
  %lm = piper.param_ref @lm : tensor<4xf32>
  piper.accumulate_grad @lm, %lm : tensor<4xf32>
  %e = piper.param_ref @wte : tensor<4xf32>
  piper.accumulate_grad @wte, %e : tensor<4xf32>
  piper.yield
}
piper.segment @bwd0() {
  %w = piper.param_ref @w : tensor<4xf32>
  piper.accumulate_grad @w, %w : tensor<4xf32>
  %e = piper.param_ref @wte : tensor<4xf32>
  piper.accumulate_grad @wte, %e : tensor<4xf32>
  piper.yield
}
piper.segment @upd0() {
  piper.adamw @w {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  piper.adamw @wte {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  piper.yield
}
piper.segment @upd3() {
  piper.adamw @lm {lr = 1.0e-03 : f64, beta1 = 0.9 : f64, beta2 = 0.95 : f64, eps = 1.0e-08 : f64, weight_decay = 0.0 : f64}
  piper.yield
}
piper.program @model {
  %b3 = piper.task @bwd3() {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 3, MB = 0, PASS = B>} : () -> !piper.token
  %b0 = piper.task @bwd0() after(%b3) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, MB = 0, PASS = B>} : () -> !piper.token
  %u0 = piper.task @upd0() after(%b0, %b3) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, PASS = U>} : () -> !piper.token
  %u3 = piper.task @upd3() after(%b3) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 3, PASS = U>} : () -> !piper.token
}
