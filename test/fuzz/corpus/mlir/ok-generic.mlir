// Generic-form operations (no dialect is registered in the fuzz target),
// with regions, block arguments, attributes, types and aliases.
#map = affine_map<(d0, d1)[s0] -> (d0 * 4 + d1 floordiv 2, -d1 + s0 mod 3)>
#set = affine_set<(d0)[s0] : (d0 - s0 >= 0, d0 == 2)>
!pair = tuple<tensor<4x8xf32>, memref<?x4xi32>>
"builtin.module"() ({
  "t.func"() ({
  ^bb0(%arg0: tensor<4x8xf32>, %arg1: i64):
    %0 = "t.add"(%arg0, %arg0) {map = #map, set = #set, n = -12 : i64, f = 1.5e-3 : f32} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
    %1:2 = "t.split"(%0) {names = ["a", "b"], d = dense<[[1.0, -2.0]]> : tensor<1x2xf32>} : (tensor<4x8xf32>) -> (!pair, i1)
    "t.return"(%1#0) : (!pair) -> () loc(#loc1)
  }) {sym_name = "f"} : () -> ()
}) : () -> ()
#loc0 = loc("model.py":3:7)
#loc1 = loc(fused[#loc0, "x"])
