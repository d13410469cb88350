// Every verifier diagnostic of context parallelism's ops and attributes
// (docs/context-parallel.md), one case per split; the valid forms
// round-trip at the end.
// RUN: piper-opt %s -allow-unregistered-dialect -split-input-file -verify-diagnostics

// expected-error @+1 {{'piper.mesh' must be a #piper.mesh of tp or cp at least 2 on the module, got #piper.mesh<tp = 1, cp = 1>}}
module attributes {piper.mesh = #piper.mesh<cp = 1>} {}

// -----

// Whether the ring's exchanges overlap its steps: a boolean on the module.
// expected-error @+1 {{'piper.context_parallel_overlap' must be a boolean on the module, got 1 : i64}}
module attributes {piper.context_parallel_overlap = 1 : i64} {}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<8x16xf32> {
  // Each member holds two of 2 cp equal chunks of a sequence.
  // expected-error @+1 {{seq 6 must be a multiple of 2 * cp = 4}}
  %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 6 : i64} : (tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<6x48xf32>) -> tensor<6x16xf32> {
  // expected-error @+1 {{rows 6 must be a multiple of seq / cp = 4}}
  %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<6x48xf32>) -> (tensor<6x16xf32>, tensor<6x4xf32>)
  piper.yield %y : tensor<6x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<8x16xf32> {
  // The log-sum-exp is a pair per head.
  // expected-error @+1 {{lse must be [8, 4], got 'tensor<8x2xf32>'}}
  %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x2xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x40xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{qkv must have (heads + 2 * kv_heads) * head_dim = 48 columns, got 40}}
  %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x40xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %y: tensor<8x16xf32>, %lse: tensor<8x4xf32>, %dy: tensor<8x8xf32>) -> tensor<8x48xf32> {
  // expected-error @+1 {{grad must be [8, 16], got 'tensor<8x8xf32>'}}
  %d = piper.cp_attention_grad %qkv, %y, %lse, %dy {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>, tensor<8x16xf32>, tensor<8x4xf32>, tensor<8x8xf32>) -> tensor<8x48xf32>
  piper.yield %d : tensor<8x48xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %kv: tensor<8x32xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{step must be in [0, cp = 2), got 2}}
  %y, %lse = piper.attention_block %qkv, %kv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 2 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %kv: tensor<8x32xf32>) -> tensor<8x16xf32> {
  // A later step continues the earlier steps' output and log-sum-exp.
  // expected-error @+1 {{step 0 carries nothing and every later step carries the previous step's two results, got 0 carried value(s) at step 1}}
  %y, %lse = piper.attention_block %qkv, %kv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 1 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %kv: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // The key/value shard is the k and v columns.
  // expected-error @+1 {{kv must be [8, 32], got 'tensor<8x16xf32>'}}
  %y, %lse = piper.attention_block %qkv, %kv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 0 : i64} : (tensor<8x48xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %kv: tensor<8x32xf32>, %y: tensor<8x16xf32>, %lse: tensor<8x4xf32>, %dy: tensor<8x16xf32>, %dq: tensor<8x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{step 0 carries nothing and a later step carries nothing or the previous step's two results, got 1 carried value(s) at step 1}}
  %a, %b = piper.attention_block_grad %qkv, %kv, %y, %lse, %dy, %dq {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 1 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>, tensor<8x16xf32>, tensor<8x4xf32>, tensor<8x16xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x32xf32>)
  piper.yield %a : tensor<8x16xf32>
}

// -----

piper.segment @s(%kv: tensor<8x32xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{offset 2 moves nothing around a ring of 2}}
  %r = piper.cp_ring_shift %kv {cp = 2 : i64, offset = 2 : i64} : tensor<8x32xf32>
  piper.yield %r : tensor<8x32xf32>
}

// -----

// Offsets are signed: -3 is a whole turn of a ring of 3 (and is named as
// -3, not 2^64 - 3).
piper.segment @s(%kv: tensor<8x32xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{offset -3 moves nothing around a ring of 3}}
  %r = piper.cp_ring_shift %kv {cp = 3 : i64, offset = -3 : i64} : tensor<8x32xf32>
  piper.yield %r : tensor<8x32xf32>
}

// -----

piper.segment @s(%kv: tensor<8x32xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{cp must be at least 2, got -2}}
  %r = piper.cp_ring_shift %kv {cp = -2 : i64, offset = 1 : i64} : tensor<8x32xf32>
  piper.yield %r : tensor<8x32xf32>
}

// -----

piper.segment @s(%x: tensor<8x4xf32>, %p: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{cp must be positive, and seq a multiple of 2 * cp}}
  %y = piper.position_add %x, %p {cp = 2 : i64, seq = 6 : i64} : (tensor<8x4xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  piper.yield %y : tensor<8x4xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{device 1 is in two rings}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1, 2, 3>, offset = 1 : i64, rings = [#piper.group<0, 1>, #piper.group<1, 2>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{the rings must cover the group: 2 of its 4 devices are in one}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1, 2, 3>, offset = 1 : i64, rings = [#piper.group<0, 2>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

// The valid forms parse and verify.
module attributes {piper.mesh = #piper.mesh<cp = 2>, piper.context_parallel_stream = "cp_stream"} {
  piper.segment @s(%qkv: tensor<8x48xf32>, %dy: tensor<8x16xf32>) -> tensor<8x48xf32> {
    %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
    %kv = piper.columns %qkv {start = 16 : i64} : (tensor<8x48xf32>) -> tensor<8x32xf32>
    %o0, %l0 = piper.attention_block %qkv, %kv {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 0 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
    %kv1 = piper.cp_ring_shift %kv {cp = 2 : i64, offset = 1 : i64} : tensor<8x32xf32>
    // The backward ring's offset -1, around rings of 3 and 5 (whose sizes
    // divide 2^64 - 1, what -1 read unsigned would be).
    %kvb3 = piper.cp_ring_shift %kv {cp = 3 : i64, offset = -1 : i64} : tensor<8x32xf32>
    %kvb5 = piper.cp_ring_shift %kv {cp = 5 : i64, offset = -1 : i64} : tensor<8x32xf32>
    %o1, %l1 = piper.attention_block %qkv, %kv1, %o0, %l0 {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 1 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>, tensor<8x16xf32>, tensor<8x4xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
    %dq, %dkv = piper.attention_block_grad %qkv, %kv, %o1, %l1, %dy {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 0 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>, tensor<8x16xf32>, tensor<8x4xf32>, tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x32xf32>)
    %d = piper.cp_attention_grad %qkv, %y, %lse, %dy {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>, tensor<8x16xf32>, tensor<8x4xf32>, tensor<8x16xf32>) -> tensor<8x48xf32>
    piper.yield %d : tensor<8x48xf32>
  }
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %kv: tensor<8x32xf32>, %o: tensor<8x16xf32>, %l: tensor<8x2xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{lse must be [8, 4], got 'tensor<8x2xf32>'}}
  %y, %lse = piper.attention_block %qkv, %kv, %o, %l {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 1 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>, tensor<8x16xf32>, tensor<8x2xf32>) -> (tensor<8x16xf32>, tensor<8x2xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>, %kv: tensor<8x32xf32>, %o: tensor<8x8xf32>, %l: tensor<8x4xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{the carried output and log-sum-exp must have the results' types}}
  %y, %lse = piper.attention_block %qkv, %kv, %o, %l {cp = 2 : i64, heads = 2 : i64, seq = 8 : i64, step = 1 : i64} : (tensor<8x48xf32>, tensor<8x32xf32>, tensor<8x8xf32>, tensor<8x4xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{heads (2) must be a multiple of kv_heads (3)}}
  %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 2 : i64, kv_heads = 3 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> (tensor<8x16xf32>, tensor<8x4xf32>)
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%kv: tensor<8x32xf32>) -> tensor<8x32xf32> {
  // expected-error @+1 {{cp must be at least 2, got 1}}
  %r = piper.cp_ring_shift %kv {cp = 1 : i64, offset = 1 : i64} : tensor<8x32xf32>
  piper.yield %r : tensor<8x32xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{rings must have one size, got 2 and 1 members}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1, 2>, offset = 1 : i64, rings = [#piper.group<0, 1>, #piper.group<2>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{ring member 5 is not in the group}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1>, offset = 1 : i64, rings = [#piper.group<0, 5>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{offset 2 moves nothing around rings of 2}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1>, offset = 2 : i64, rings = [#piper.group<0, 1>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{offset -5 moves nothing around rings of 5}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1, 2, 3, 4>, offset = -5 : i64, rings = [#piper.group<0, 1, 2, 3, 4>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

// The backward ring's offset -1 around rings of 3 verifies.
piper.segment @f() -> tensor<8x4xf32> {
  %a = "test.make"() : () -> tensor<8x4xf32>
  piper.yield %a : tensor<8x4xf32>
}
piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  %y, %t = piper.ring_shift %x {devices = #piper.group<0, 1, 2>, offset = -1 : i64, rings = [#piper.group<0, 1, 2>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

piper.program @p {
  %x, %a = piper.task @f() {tag = #piper.tag<>} : () -> (tensor<8x4xf32>, !piper.token)
  // expected-error @+1 {{rings must have at least 2 members, got 1}}
  %y, %t = piper.ring_shift %x {devices = #piper.group<0>, offset = 1 : i64, rings = [#piper.group<0>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<8x4xf32>
}

// -----

// Ulysses: the heads must split over the members.
piper.segment @s(%qkv: tensor<8x40xf32>) -> tensor<16x20xf32> {
  // expected-error @+1 {{heads (3) and kv_heads (1) must be multiples of cp = 2 (each member attends with its share of the heads)}}
  %h = piper.cp_seq_to_heads %qkv {cp = 2 : i64, heads = 3 : i64, kv_heads = 1 : i64, seq = 8 : i64} : (tensor<8x40xf32>) -> tensor<16x20xf32>
  piper.yield %h : tensor<16x20xf32>
}

// -----

piper.segment @s(%qkv: tensor<8x48xf32>) -> tensor<8x24xf32> {
  // expected-error @+1 {{the narrow side must be [16, 24], got 'tensor<8x24xf32>'}}
  %h = piper.cp_seq_to_heads %qkv {cp = 2 : i64, heads = 2 : i64, kv_heads = 2 : i64, seq = 8 : i64} : (tensor<8x48xf32>) -> tensor<8x24xf32>
  piper.yield %h : tensor<8x24xf32>
}

// -----

piper.segment @s(%y: tensor<12x8xf32>) -> tensor<6x16xf32> {
  // expected-error @+1 {{seq 6 must be a positive multiple of 2 * cp = 4 (each member holds two of 2 * cp equal chunks)}}
  %x = piper.cp_heads_to_seq %y {cp = 2 : i64, heads = 2 : i64, seq = 6 : i64} : (tensor<12x8xf32>) -> tensor<6x16xf32>
  piper.yield %x : tensor<6x16xf32>
}

// -----

piper.segment @s(%y: tensor<12x8xf32>) -> tensor<12x8xf32> {
  // expected-error @+1 {{rows 12 are not whole sequences of 8}}
  %x = piper.cp_ulysses_natural %y {cp = 2 : i64, seq = 8 : i64} : (tensor<12x8xf32>) -> tensor<12x8xf32>
  piper.yield %x : tensor<12x8xf32>
}

// -----

piper.segment @s(%y: tensor<16x8xf32>) -> tensor<2xi32> {
  // expected-error @+1 {{counts must have cp = 2 entries}}
  %x, %c = piper.cp_ulysses_zigzag %y {cp = 2 : i64, seq = 8 : i64} : (tensor<16x8xf32>) -> (tensor<16x8xf32>, tensor<4xi32>)
  piper.yield %c : tensor<4xi32>
}

// -----

piper.segment @s(%y: tensor<16x8xf32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{result type must equal the input type}}
  %x, %c = piper.cp_ulysses_zigzag %y {cp = 2 : i64, seq = 8 : i64} : (tensor<16x8xf32>) -> (tensor<8x16xf32>, tensor<2xi32>)
  piper.yield %x : tensor<8x16xf32>
}

// -----

piper.segment @s(%x: tensor<8x48xf32>) -> tensor<16x24xf32> {
  // expected-error @+1 {{counts must have cp = 2 entries}}
  %b, %c = piper.cp_ulysses_split %x {cp = 2 : i64, heads = 2 : i64, kv_heads = 2 : i64} : (tensor<8x48xf32>) -> (tensor<16x24xf32>, tensor<3xi32>)
  piper.yield %b : tensor<16x24xf32>
}

// -----

piper.segment @s(%b: tensor<16x8xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{cp must be at least 2, got 1}}
  %y = piper.cp_ulysses_merge %b {cp = 1 : i64, heads = 2 : i64} : (tensor<16x8xf32>) -> tensor<8x16xf32>
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%b: tensor<15x8xf32>, %c: tensor<2xi32>) -> tensor<15x8xf32> {
  // expected-error @+1 {{rows 15 are not cp = 2 equal blocks}}
  %r, %rc = piper.cp_all_to_all %b, %c {cp = 2 : i64} : tensor<15x8xf32>, tensor<2xi32>
  piper.yield %r : tensor<15x8xf32>
}

// -----

piper.segment @s(%b: tensor<16x8xf32>, %c: tensor<4xi32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{send_counts must have cp = 2 entries}}
  %r, %rc = piper.cp_all_to_all %b, %c {cp = 2 : i64} : tensor<16x8xf32>, tensor<4xi32>
  piper.yield %r : tensor<16x8xf32>
}

// -----

// MoE layers under context parallelism: the member's part of whole
// sequences.
piper.segment @s(%x: tensor<8x16xf32>) -> tensor<12x16xf32> {
  // expected-error @+1 {{the member's part must be [6, 16], got 'tensor<8x16xf32>'}}
  %all = piper.cp_gather %x {cp = 2 : i64, seq = 4 : i64} : (tensor<8x16xf32>) -> tensor<12x16xf32>
  piper.yield %all : tensor<12x16xf32>
}

// -----

piper.segment @s(%x: tensor<16x16xf32>) -> tensor<8x16xf32> {
  // expected-error @+1 {{seq 6 must be a positive multiple of 2 * cp = 4}}
  %y = piper.cp_split %x {cp = 2 : i64, seq = 6 : i64} : (tensor<16x16xf32>) -> tensor<8x16xf32>
  piper.yield %y : tensor<8x16xf32>
}

// -----

piper.segment @s(%x: tensor<8x16xf32>) -> tensor<16x8xf32> {
  // expected-error @+1 {{the member's part must be [8, 8], got 'tensor<8x16xf32>'}}
  %all = piper.cp_all_gather %x {cp = 2 : i64} : (tensor<8x16xf32>) -> tensor<16x8xf32>
  piper.yield %all : tensor<16x8xf32>
}

// -----

piper.segment @s(%x: tensor<15x16xf32>) -> tensor<7x16xf32> {
  // expected-error @+1 {{rows 15 are not cp = 2 equal blocks}}
  %y = piper.cp_reduce_scatter %x {cp = 2 : i64} : (tensor<15x16xf32>) -> tensor<7x16xf32>
  piper.yield %y : tensor<7x16xf32>
}
