// piper-lower-segment-collectives: one lowering for the in-segment
// collectives of every axis. Each task's segment is cut around them and each
// becomes the node of its kind over its axis's groups of the task's devices
// (the layout's: tp innermost, ep over the data replicas of each tensor
// member, cp rings), on its axis's stream; tp_copy goes. An overlapped ring
// exchange is ordered by its data alone, and the op reading what it passed
// starts a piece of its own.
// RUN: piper-opt %s -split-input-file -piper-lower-segment-collectives -verify-diagnostics | FileCheck %s

// CHECK-LABEL: piper.segment @s.0
// CHECK-NOT: piper.tp_copy
// CHECK-LABEL: piper.segment @s.2
// CHECK-LABEL: piper.segment @e.0
// CHECK: piper.moe_ep_counts
// CHECK-LABEL: piper.segment @e.2
// CHECK-NOT: piper.ep_exchange
// CHECK: %[[X:[^ ,]+]], %[[XD:[^ ,]+]] = piper.task @s.0(%tokens) {devices = #piper.group<0, 1, 2, 3>
// CHECK-NEXT: %[[S:[^ ,]+]], %[[SD:[^ ,]+]] = piper.all_reduce %[[X]] : tensor<8x4xf32> -> tensor<8x4xf32> after(%[[XD]]) {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"tp_stream", comm>, subgroups = [#piper.group<0, 1>, #piper.group<2, 3>]
// CHECK-NEXT: %[[Y:[^ ,]+]], %[[YD:[^ ,]+]] = piper.task @s.2(%[[S]], %[[X]]) after(%[[SD]])
// CHECK-NEXT: %[[N:[^ ,]+]], %[[ND:[^ ,]+]] = piper.task @e.0(%tokens) after(%[[YD]])
// CHECK-NEXT: %[[R:[^ ,]+]], %{{.*}}, %[[RD:[^ ,]+]] = piper.all_to_all %[[Y]], %[[N]] after(%[[ND]]) {devices = #piper.group<0, 1, 2, 3>, stream = #piper.stream<"ep_stream", comm>, subgroups = [#piper.group<0, 2>, #piper.group<1, 3>]
// CHECK-NEXT: piper.task @e.2(%[[R]], %[[Y]]) after(%[[RD]])
module attributes {piper.mesh = #piper.mesh<tp = 2>} {
  piper.param @wte : tensor<16x4xf32> init normal(1.0)
  piper.segment @s(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
    %w = piper.param_ref @wte : tensor<16x4xf32>
    %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    %a = piper.tp_copy %x : tensor<8x4xf32>
    %y = piper.tp_reduce %a : tensor<8x4xf32>
    %z = piper.add %y, %x : tensor<8x4xf32>
    piper.yield %z : tensor<8x4xf32>
  }
  piper.segment @e(%x: tensor<8x4xf32>, %tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
    %send, %counts, %esend = piper.moe_ep_counts %tok {capacity = 4 : i64, experts = 4 : i64, members = 2 : i64} : (tensor<2x4xi32>) -> (tensor<2xi32>, tensor<4x1xi32>, tensor<2xi32>)
    %r, %c = piper.ep_exchange %x, %send {members = 2 : i64, stream = "ep_stream"} : tensor<8x4xf32>, tensor<2xi32>
    %z = piper.add %r, %x : tensor<8x4xf32>
    piper.yield %z : tensor<8x4xf32>
  }
  piper.program @train {
    %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
    %y, %d = piper.task @s(%tok) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
    %z, %d2 = piper.task @e(%y, %tok) after(%d) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<8x4xf32>, tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  }
}

// -----

// CHECK: piper.program @train
// CHECK-NEXT: piper.batch
// CHECK-NEXT: %[[X:[^ ,]+]], %[[XD:[^ ,]+]] = piper.task @r.0(%tokens)
// CHECK-NEXT: %[[S:[^ ,]+]], %{{.*}} = piper.ring_shift %[[X]] {devices = #piper.group<0, 1, 2, 3>, offset = 1 : i64, rings = [#piper.group<0, 1>, #piper.group<2, 3>], stream = #piper.stream<"cp_stream", comm>
// CHECK-NEXT: %[[M:[^ ,]+]], %[[MD:[^ ,]+]] = piper.task @r.2(%[[X]]) after(%[[XD]])
// CHECK-NEXT: piper.task @r.3(%[[S]], %[[M]]) after(%[[MD]])
module attributes {piper.mesh = #piper.mesh<cp = 2>} {
  piper.param @wte : tensor<16x4xf32> init normal(1.0)
  piper.segment @r(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
    %w = piper.param_ref @wte : tensor<16x4xf32>
    %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    %s = piper.cp_ring_shift %x {cp = 2 : i64, offset = 1 : i64} : tensor<8x4xf32>
    %m = piper.add %x, %x : tensor<8x4xf32>
    %z = piper.add %s, %m : tensor<8x4xf32>
    piper.yield %z : tensor<8x4xf32>
  }
  piper.program @train {
    %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
    %y, %d = piper.task @r(%tok) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  }
}

// -----

// A task on devices that are not whole groups of the axis.
module attributes {piper.mesh = #piper.mesh<tp = 2>} {
  piper.param @wte : tensor<16x4xf32> init normal(1.0)
  piper.segment @s(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
    %w = piper.param_ref @wte : tensor<16x4xf32>
    %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    %y = piper.tp_reduce %x : tensor<8x4xf32>
    piper.yield %y : tensor<8x4xf32>
  }
  piper.program @train {
    %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
    // expected-error @+1 {{'piper.task' op task @s (PP=0 MB=0 PASS=F) runs on [0, 1, 2], which is not made of whole tensor-parallel groups of 2; place its stage on a multiple of 2 devices}}
    %y, %d = piper.task @s(%tok) {devices = #piper.group<0, 1, 2>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  }
}

// -----

// Expert-parallel groups of 4 replicas of each tensor member need 8 devices.
module attributes {piper.mesh = #piper.mesh<tp = 2>} {
  piper.param @wte : tensor<16x4xf32> init normal(1.0)
  piper.segment @e(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
    %w = piper.param_ref @wte : tensor<16x4xf32>
    %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    %send, %counts, %esend = piper.moe_ep_counts %tok {capacity = 4 : i64, experts = 4 : i64, members = 4 : i64} : (tensor<2x4xi32>) -> (tensor<4xi32>, tensor<4x1xi32>, tensor<4xi32>)
    %r, %c = piper.ep_exchange %x, %send {members = 4 : i64, stream = "ep_stream"} : tensor<8x4xf32>, tensor<4xi32>
    piper.yield %r : tensor<8x4xf32>
  }
  piper.program @train {
    %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
    // expected-error @+1 {{runs on [0, 1, 2, 3], which is not made of whole expert-parallel groups of 4 (times tensor parallelism 2); place its stage on a multiple of 8 devices}}
    %y, %d = piper.task @e(%tok) {devices = #piper.group<0, 1, 2, 3>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  }
}

// -----

// A ring exchange without the module's context-parallel degree.
module {
  piper.param @wte : tensor<16x4xf32> init normal(1.0)
  piper.segment @r(%tok: tensor<2x4xi32>) -> tensor<8x4xf32> {
    %w = piper.param_ref @wte : tensor<16x4xf32>
    %x = piper.embedding %tok, %w : (tensor<2x4xi32>, tensor<16x4xf32>) -> tensor<8x4xf32>
    // expected-error @+1 {{'piper.cp_ring_shift' op needs the module's context-parallel degree (the cp of piper.mesh, set by context_parallel)}}
    %s = piper.cp_ring_shift %x {cp = 2 : i64, offset = 1 : i64} : tensor<8x4xf32>
    piper.yield %s : tensor<8x4xf32>
  }
  piper.program @train {
    %tok, %tgt, %bd = piper.batch {tag = #piper.tag<MB = 0>} : tensor<2x4xi32>, tensor<2x4xi32>
    %y, %d = piper.task @r(%tok) {devices = #piper.group<0, 1>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : (tensor<2x4xi32>) -> (tensor<8x4xf32>, !piper.token)
  }
}

// -----

// Without shard_tensor's degree on the module, a stray f or g is an error.
piper.segment @s(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'piper.tp_reduce' op needs the module's tensor-parallel degree (the tp of piper.mesh, set by shard_tensor)}}
  %y = piper.tp_reduce %x : tensor<8x4xf32>
  piper.yield %y : tensor<8x4xf32>
}
