// piper-shard: expert parallelism for one stage (docs/expert-parallel.md).
// A one-layer MoE model (4 experts, top 2) placed on [0, 1, 2, 3], its
// experts split over the groups {0, 1} and {2, 3}; the exchanges the shard
// rewrite leaves become all-to-alls in piper-lower-segment-collectives.
// RUN: piperc model qwen3-moe --layers 1 --hidden 8 --heads 2 --kv-heads 1 --ffn 8 --experts 4 --top-k 2 --vocab 16 --seq 4 --batch 2 -o %t.mlir
// RUN: piper-opt %t.mlir -piper-stage=stages=1 -piper-build-training-dag -piper-place="pp=0 devices=0,1,2,3" \
// RUN:   -piper-shard="pp=0 devices=0,1,2,3 ep=2" -piper-lower-segment-collectives | FileCheck %s
// RUN: piper-opt %t.mlir -piper-stage=stages=1 -piper-build-training-dag -piper-place="pp=0 devices=0,1,2,3" \
// RUN:   -piper-shard="pp=0 devices=0,1,2,3 ep=2" -piper-lower-segment-collectives -piper-replicate="pp=0 devices=0,1,2,3" | FileCheck %s --check-prefix=REDUCE
// RUN: not piper-opt %t.mlir -piper-stage=stages=1 -piper-build-training-dag -piper-place="pp=0 devices=0,1,2,3" \
// RUN:   -piper-shard="pp=0 devices=0,1,2,3 ep=3" 2>&1 | FileCheck %s --check-prefix=BAD-EP
// RUN: not piper-opt %t.mlir -piper-stage=stages=1 -piper-build-training-dag -piper-place="pp=0 devices=0,1,2,3" \
// RUN:   -piper-shard="pp=0 devices=0,1" 2>&1 | FileCheck %s --check-prefix=ELSEWHERE
// RUN: not piper-opt %t.mlir -piper-stage=stages=1 -piper-build-training-dag -piper-place="pp=0 devices=0,1,2,3" \
// RUN:   -piper-shard="pp=0 devices=0,1,2,3 ep=2" -piper-shard="pp=0 devices=0,1,2,3 ep=2" 2>&1 | FileCheck %s --check-prefix=TWICE
// RUN: not piper-opt %t.mlir -piper-stage=stages=1 -piper-build-training-dag -piper-place="pp=0 devices=0,1" \
// RUN:   -piper-shard="pp=0 devices=1,0" 2>&1 | FileCheck %s --check-prefix=UNSORTED

// Each member keeps two of the four experts of every expert weight.
// CHECK: piper.param @layers.0.moe.experts.w13 : tensor<2x8x16xf32> init normal(2.000000e-02) {expert_members = 2 : i64}
// CHECK: piper.param @layers.0.moe.experts.w2 : tensor<2x8x8xf32> init normal({{.*}}) {expert_members = 2 : i64}

// Forward: the router's counts and the packed rows leave the first piece;
// the experts' piece lays the received rows out as its two experts' slots,
// runs them and scatters them back; the last piece unpacks and combines.
// CHECK-LABEL: piper.segment @stage0_F.0
// CHECK: piper.moe_ep_counts %indices {capacity = 8 : i64, experts = 4 : i64, members = 2 : i64}
// CHECK: piper.moe_ep_pack
// CHECK-LABEL: piper.segment @stage0_F.3
// CHECK: piper.moe_ep_gather %arg0, %arg1 {capacity = 8 : i64, experts = 4 : i64, members = 2 : i64}
// CHECK: piper.expert_linear %{{.*}} {experts = 2 : i64} : (tensor<32x8xf32>, tensor<2x8x16xf32>) -> tensor<32x16xf32>
// CHECK: piper.moe_ep_scatter
// CHECK-LABEL: piper.segment @stage0_F.5
// CHECK: piper.moe_ep_unpack
// CHECK: piper.moe_combine
// Backward: the same exchanges around the expert gradients.
// CHECK-LABEL: piper.segment @stage0_B.0
// CHECK: piper.moe_combine_grad
// CHECK: piper.moe_ep_counts
// CHECK: piper.moe_ep_pack %dinput
// CHECK-LABEL: piper.segment @stage0_B.3
// CHECK: piper.moe_ep_gather
// CHECK: piper.expert_linear_grad_weight {{.*}} -> tensor<2x8x16xf32>
// CHECK: piper.moe_ep_scatter
// CHECK-LABEL: piper.segment @stage0_B.5
// CHECK: piper.moe_ep_unpack
// CHECK: piper.moe_dispatch_grad
// CHECK-NOT: piper.ep_exchange

// The program: rows and per-expert counts go out, rows come back, each over
// the member's expert group.
// CHECK: [[F0:%[a-z0-9_]+]]:14, [[D0:%[a-z0-9_]+]] = piper.task @stage0_F.0
// CHECK-NEXT: [[ROWS:%[a-z0-9_]+]], [[RC:%[a-z0-9_]+]], [[D1:%[a-z0-9_]+]] = piper.all_to_all [[F0]]#0, [[F0]]#1 after([[D0]]) {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"ep_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>], tag = #piper.tag<PP = 0, PASS = F>}
// CHECK-NEXT: [[CNT:%[a-z0-9_]+]], {{.*}} = piper.all_to_all [[F0]]#2, [[F0]]#3
// CHECK-NEXT: [[F3:%[a-z0-9_]+]]:4, [[D3:%[a-z0-9_]+]] = piper.task @stage0_F.3([[ROWS]], [[CNT]]) after
// CHECK-NEXT: piper.all_to_all [[F3]]#0, [[RC]] after([[D3]])
// CHECK: piper.task @stage0_B.0
// CHECK-COUNT-3: piper.all_to_all

// replicate then sums the expert gradients over the replicas holding the
// same experts ({0, 2} and {1, 3}) and the rest over all four.
// REDUCE: piper.all_reduce grads [{{.*}}@layers.0.moe.router.weight{{.*}}] after
// REDUCE-NEXT: piper.all_reduce grads [@layers.0.moe.experts.w2, @layers.0.moe.experts.w13] {{.*}}subgroups = [#piper.group<0, 2>, #piper.group<1, 3>]

// BAD-EP: error: directive #0 (piper-shard pp=0): "ep" must divide the 4 devices (expert groups are carved out of them)
// ELSEWHERE: no forward or backward task runs on [0, 1]; place the stage there first
// TWICE: directive #0 (piper-shard pp=0): its MoE layers are already split by another shard directive
// UNSORTED: devices must be listed in increasing order (member i of an expert-parallel group is its i-th device)
