// piper-bound-zero-collectives: after the order directives, bounds the
// ZeRO-2 gradients in flight (a backward piece waits for the
// reduce-scatters of the piece two before it on its device group and
// stream) and gives each ZeRO-3 all-gather its prefetch dependency.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=3 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 zero=2 bucket-mb=0.00005" -piper-bound-zero-collectives | FileCheck %s --check-prefix=ZERO2
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1 zero=3 bucket-mb=0.0001" -piper-bound-zero-collectives | FileCheck %s --check-prefix=ZERO3
// Without ZeRO-2/3 nothing changes.
// RUN: piper-opt %S/Inputs/dag.mlir -piper-split=microbatches=2 -piper-place="pp=0 devices=0,1" -piper-place="pp=1 devices=2,3" \
// RUN:   -piper-replicate="pp=0 devices=0,1" -o %t.before.mlir
// RUN: piper-opt %t.before.mlir -piper-bound-zero-collectives -o %t.after.mlir
// RUN: diff %t.before.mlir %t.after.mlir

// ZeRO-2: the backward is cut into two pieces (B.0, B.1) per microbatch. The
// pieces of MB 1 wait for the reduce-scatters of MB 0's same piece (two
// piece tasks earlier), and MB 2's for MB 1's.
// ZERO2: %{{.*}}, %[[D0:[^ ]+]] = piper.task @stage0_B.0({{.*}}tag = #piper.tag<PP = 0, MB = 0, PASS = B>
// ZERO2-NEXT: %[[RS0:[^ ]+]] = piper.reduce_scatter_grads [@b1] {{.*}} after(%[[D0]])
// ZERO2-NEXT: %[[RS1:[^ ]+]] = piper.reduce_scatter_grads [@w1] {{.*}} after(%[[D0]])
// ZERO2-NEXT: %{{.*}}, %[[D1:[^ ]+]] = piper.task @stage0_B.1({{.*}}) after(%[[D0]]) {{.*}}MB = 0
// ZERO2-NEXT: %[[RS2:[^ ]+]] = piper.reduce_scatter_grads [@wte] {{.*}} after(%[[D1]])
// ZERO2: piper.task @stage0_B.0({{.*}}) after(%[[RS0]], %[[RS1]]) {{.*}}MB = 1
// ZERO2: piper.task @stage0_B.1({{.*}}) after(%{{[^,]+}}, %[[RS2]]) {{.*}}MB = 1

// ZeRO-3: the gathers of microbatch 1's forward pieces wait for microbatch
// 0's pieces: one piece's parameters gathered ahead of its use.
// ZERO3: %{{.*}}, %[[F00:[^ ]+]] = piper.task @stage0_F.0({{.*}}MB = 0, PASS = F>
// ZERO3: %{{.*}}, %[[F01:[^ ]+]] = piper.task @stage0_F.1({{.*}}MB = 0, PASS = F>
// ZERO3: piper.all_gather_params [@wte] -> tensor<16x4xf32> after(%[[F00]]) {{.*}}MB = 1, PASS = F>
// ZERO3: piper.all_gather_params [@w1, @b1] -> tensor<4x4xf32>, tensor<4xf32> after(%[[F01]]) {{.*}}MB = 1, PASS = F>
