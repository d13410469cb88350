// Context parallelism's ops (docs/context-parallel.md): ring attention
// over a sequence split between the members of a context-parallel group,
// the per-step kernels it lowers to, and the ring's exchanges. Member m of
// N holds chunks m and 2N - 1 - m of the 2N equal chunks of every sequence
// (Megatron's load-balanced causal layout), so local row t of a sequence
// has the global position m C + t for t < C and (2N - 1 - m) C + t - C
// after (C = seq / 2N). The member comes from the runtime.
#ifndef PIPER_CP_OPS
#define PIPER_CP_OPS

def Piper_CpAttentionOp : Piper_Op<"cp_attention", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Causal attention of a member's rows over the whole sequence (ring)";
  let description = [{
    `piper.attention` with the sequence split over `cp` members: `qkv`
    holds this member's rows (B sequences of seq / cp rows, chunks m and
    2 cp - 1 - m of each), attending causally to every earlier position of
    the global sequence of `seq` tokens; RoPE rotates at global positions.
    `result` is the attention output of the member's rows, `lse` [N,
    2 heads] the log-sum-exp of each row's scores (kept for the backward)
    as a pair per head: column h a bf16 value, column heads + h the rest,
    so that bf16 storage in mixed precision keeps it to |lse| 2^-16. The
    `context_parallel` rewrite makes it from `piper.attention`; its
    gradient is `piper.cp_attention_grad`. After placement,
    piper-lower-context-parallel lowers it to `cp` `piper.attention_block` kernels
    with the key/value shards passed around the ring between them
    (`piper.cp_ring_shift`).

    ```mlir
    %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64} : (tensor<64x192xf32>) -> (tensor<64x64xf32>, tensor<64x8xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, I64Attr:$heads, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp,
                       OptionalAttr<Piper_RopeScalingAttr>:$rope_scaling);
  let results = (outs F32Tensor2D:$result, F32Tensor2D:$lse);
  let assemblyFormat = "$qkv attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumKvHeads() { return getKvHeads().value_or(getHeads()); }
  }];
}

def Piper_CpAttentionGradOp : Piper_Op<"cp_attention_grad", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>]> {
  let summary = "Gradient of cp_attention w.r.t. packed q|k|v (ring)";
  let description = [{
    The gradient of `piper.cp_attention` for the output gradient `grad`,
    from the forward's `qkv`, `result` and `lse`; the attributes equal the
    forward's. Lowered after placement to `cp` `piper.attention_block_grad`
    kernels: the key/value shards travel around the ring the other way,
    each with the partial gradient of its owner's keys and values, which a
    last exchange returns to the owner.

    ```mlir
    %dqkv = piper.cp_attention_grad %qkv, %y, %lse, %dy {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64} : (tensor<64x192xf32>, tensor<64x64xf32>, tensor<64x8xf32>, tensor<64x64xf32>) -> tensor<64x192xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$y, F32Tensor2D:$lse,
                       F32Tensor2D:$grad, I64Attr:$heads, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp,
                       OptionalAttr<Piper_RopeScalingAttr>:$rope_scaling);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = [{
    $qkv `,` $y `,` $lse `,` $grad attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumKvHeads() { return getKvHeads().value_or(getHeads()); }
  }];
}

def Piper_AttentionBlockOp : Piper_Op<"attention_block", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>]> {
  let summary = "One ring step of cp_attention: the member's queries over one key/value shard";
  let description = [{
    The member's queries (from `qkv`) over `kv` [N, 2 kv_heads hd], the
    keys and values of owner (member - step) mod cp, at their global
    positions (causal, RoPE rotated), combined by log-sum-exp with the
    previous steps' output and log-sum-exp (`carry`: none at step 0, else
    `o` and `lse`). Results: the output so far [N, heads hd] and its
    log-sum-exp pair [N, 2 heads]; after step cp - 1 they are
    cp_attention's.

    ```mlir
    %o, %l = piper.attention_block %qkv, %kv, %o0, %l0 {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64, step = 1 : i64} : (tensor<64x192xf32>, tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x8xf32>) -> (tensor<64x64xf32>, tensor<64x8xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$kv,
                       Variadic<F32Tensor2D>:$carry, I64Attr:$heads,
                       I64Attr:$seq, OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp,
                       I64Attr:$step,
                       OptionalAttr<Piper_RopeScalingAttr>:$rope_scaling);
  let results = (outs F32Tensor2D:$result, F32Tensor2D:$lse);
  let assemblyFormat = [{
    $qkv `,` $kv (`,` $carry^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Piper_AttentionBlockGradOp : Piper_Op<"attention_block_grad", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>]> {
  let summary = "One ring step of cp_attention_grad";
  let description = [{
    For the keys and values `kv` of owner (member + step) mod cp, from the
    forward's final output `y` and log-sum-exp `lse` and the output
    gradient `grad`: the member's query gradient so far [N, heads hd]
    (adding to `carry`'s first, none at step 0) and the owner's key/value
    gradient so far [N, 2 kv_heads hd] (adding this member's part to
    `carry`'s second, which the previous members of the ring summed).
    Without `carry` (at any step) the two are this step's parts alone: the
    ring's lowering adds the sums after the step, so the step need not
    wait for the exchange that brings them.

    ```mlir
    %dq, %dkv = piper.attention_block_grad %qkv, %kv, %y, %lse, %dy {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64, step = 0 : i64} : (tensor<64x192xf32>, tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x8xf32>, tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<64x128xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$kv, F32Tensor2D:$y,
                       F32Tensor2D:$lse, F32Tensor2D:$grad,
                       Variadic<F32Tensor2D>:$carry, I64Attr:$heads,
                       I64Attr:$seq, OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp,
                       I64Attr:$step,
                       OptionalAttr<Piper_RopeScalingAttr>:$rope_scaling);
  let results = (outs F32Tensor2D:$dq, F32Tensor2D:$dkv);
  let assemblyFormat = [{
    $qkv `,` $kv `,` $y `,` $lse `,` $grad (`,` $carry^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Piper_CpRingShiftOp : Piper_Op<"cp_ring_shift", [Pure,
    SameOperandsAndResultType, HasParent<"SegmentOp">,
    Piper_SegmentCollectiveOpInterface]> {
  let extraClassDeclaration = Piper_SegmentCollective<"cp", "RingShift">.decl;
  let summary = "Passes a tensor along the context-parallel ring";
  let description = [{
    Member m of the context-parallel group sends `input` to member
    (m + offset) mod cp and gets member (m - offset) mod cp's. A marker
    the cp_attention lowering places between ring steps; it cuts the
    segment there and becomes a `piper.ring_shift` node on the
    context-parallel stream, so the next shard's transfer overlaps the
    current step's compute.

    ```mlir
    %kv1 = piper.cp_ring_shift %kv0 {cp = 2 : i64, offset = 1 : i64} : tensor<64x128xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp,
                       Piper_SignedI64Attr:$offset);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Ulysses: all-to-alls between the sequence and the heads
//===----------------------------------------------------------------------===//

def Piper_CpSeqToHeadsOp : Piper_Op<"cp_seq_to_heads", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Ulysses: a member's rows of every head to every row of its heads";
  let description = [{
    `input` [n, W] holds this member's n rows (B sequences of seq / cp
    rows, chunks m and 2 cp - 1 - m of each) of `heads` query heads then
    `kv_heads` key and `kv_heads` value heads (none: query heads only), W
    = (heads + 2 kv_heads) hd. `result` [cp n, W / cp] holds every row of
    the B sequences, in sequence order, of this member's heads: query
    heads m heads / cp ... (m + 1) heads / cp - 1 and the same share of the
    key and value heads. heads and kv_heads must be multiples of cp. The
    `context_parallel` rewrite of kind ulysses puts it before attention;
    its gradient is `piper.cp_heads_to_seq`. After placement
    piper-lower-context-parallel lowers it to `piper.cp_ulysses_split`, an
    all-to-all over the context-parallel group and
    `piper.cp_ulysses_natural`.

    ```mlir
    %h = piper.cp_seq_to_heads %qkv {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64} : (tensor<32x192xf32>) -> tensor<64x96xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq,
                       I64Attr:$heads, OptionalAttr<I64Attr>:$kv_heads);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpHeadsToSeqOp : Piper_Op<"cp_heads_to_seq", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Ulysses: every row of a member's heads back to its rows of every head";
  let description = [{
    The inverse of `piper.cp_seq_to_heads` with the same attributes (they
    describe the wide side): `input` [cp n, W / cp], `result` [n, W]. Its
    gradient is `piper.cp_seq_to_heads`. Lowered to
    `piper.cp_ulysses_zigzag`, an all-to-all and `piper.cp_ulysses_merge`.

    ```mlir
    %y = piper.cp_heads_to_seq %h {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64} : (tensor<64x32xf32>) -> tensor<32x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq,
                       I64Attr:$heads, OptionalAttr<I64Attr>:$kv_heads);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpUlyssesSplitOp : Piper_ComputeOp<"cp_ulysses_split", [Pure,
    HasParent<"SegmentOp">]> {
  let summary = "Ulysses: a member's rows as cp blocks of each member's heads";
  let description = [{
    `input` [n, W] (heads, kv_heads as `piper.cp_seq_to_heads`'s) to
    `result` [cp n, W / cp], block j member j's heads of the n rows, and
    the all-to-all's send counts (n for every member).

    ```mlir
    %b, %c = piper.cp_ulysses_split %qkv {cp = 2 : i64, heads = 4 : i64} : (tensor<32x192xf32>) -> (tensor<64x96xf32>, tensor<2xi32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$heads,
                       OptionalAttr<I64Attr>:$kv_heads);
  let results = (outs F32Tensor2D:$result, I32Tensor1D:$counts);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpUlyssesMergeOp : Piper_ComputeOp<"cp_ulysses_merge", [Pure,
    HasParent<"SegmentOp">]> {
  let summary = "Ulysses: cp blocks of each member's heads as the rows' every head";
  let description = [{
    The inverse of `piper.cp_ulysses_split`: `input` [cp n, W / cp] to
    `result` [n, W].

    ```mlir
    %y = piper.cp_ulysses_merge %b {cp = 2 : i64, heads = 4 : i64} : (tensor<64x32xf32>) -> tensor<32x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$heads,
                       OptionalAttr<I64Attr>:$kv_heads);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpUlyssesNaturalOp : Piper_ComputeOp<"cp_ulysses_natural", [Pure,
    HasParent<"SegmentOp">, SameOperandsAndResultType]> {
  let summary = "Ulysses: rows received from each member into sequence order";
  let description = [{
    `input` holds cp blocks, block i member i's rows (its chunks i and
    2 cp - 1 - i of each of the B sequences of `seq`); `result` the same
    rows in sequence order.

    ```mlir
    %h = piper.cp_ulysses_natural %r {cp = 2 : i64, seq = 32 : i64} : (tensor<64x96xf32>) -> tensor<64x96xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpUlyssesZigzagOp : Piper_ComputeOp<"cp_ulysses_zigzag", [Pure,
    HasParent<"SegmentOp">]> {
  let summary = "Ulysses: rows in sequence order into blocks of each member's rows";
  let description = [{
    The inverse of `piper.cp_ulysses_natural`, and the all-to-all's send
    counts (rows / cp for every member).

    ```mlir
    %r, %c = piper.cp_ulysses_zigzag %h {cp = 2 : i64, seq = 32 : i64} : (tensor<64x32xf32>) -> (tensor<64x32xf32>, tensor<2xi32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq);
  let results = (outs F32Tensor2D:$result, I32Tensor1D:$counts);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpAllToAllOp : Piper_Op<"cp_all_to_all", [HasParent<"SegmentOp">,
    Piper_SegmentCollectiveOpInterface,
    AllTypesMatch<["input", "result"]>,
    AllTypesMatch<["send_counts", "recv_counts"]>]> {
  let summary = "Where the Ulysses lowering cuts a segment for an all-to-all";
  let description = [{
    Member m sends block j of `input` (send_counts[j] rows) to member j of
    its context-parallel group and gets member j's block m as its block j.
    A marker the Ulysses lowering places; it cuts the segment there and
    becomes a `piper.all_to_all` over the context-parallel groups, on the
    context-parallel stream.

    ```mlir
    %r, %rc = piper.cp_all_to_all %b, %c {cp = 2 : i64} : tensor<64x96xf32>, tensor<2xi32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I32Tensor1D:$send_counts,
                       I64Attr:$cp);
  let results = (outs F32Tensor2D:$result, I32Tensor1D:$recv_counts);
  let extraClassDeclaration = Piper_SegmentCollective<"cp", "AllToAll">.decl;
  let assemblyFormat = "$input `,` $send_counts attr-dict `:` type($input) `,` type($send_counts)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// MoE layers under context parallelism: the whole sequence gathered
//===----------------------------------------------------------------------===//

def Piper_CpGatherOp : Piper_Op<"cp_gather", [Pure, HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "The whole sequence from the context-parallel members' rows";
  let description = [{
    `input` [n, C] holds this member's rows (B sequences of seq / cp rows,
    chunks m and 2 cp - 1 - m of each); `result` [cp n, C] every member's,
    in sequence order, as one device holds them. The `context_parallel`
    rewrite puts it before an MoE layer, so that routing, capacity and the
    auxiliary loss see the sequence as one device does. Its gradient is
    `piper.cp_gather_grad`. Lowered after placement to an all-gather over
    the context-parallel group and `piper.cp_ulysses_natural`.

    ```mlir
    %all = piper.cp_gather %x {cp = 2 : i64, seq = 8 : i64} : (tensor<8x16xf32>) -> tensor<16x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpGatherGradOp : Piper_Op<"cp_gather_grad", [Pure,
    HasParent<"SegmentOp">]> {
  let summary = "Gradient of cp_gather: summed over the members, the member's rows kept";
  let description = [{
    `input` [cp n, C] (sequence order) summed over the context-parallel
    group; `result` [n, C] this member's rows of the sum. Lowered to
    `piper.cp_ulysses_zigzag` and a reduce-scatter over the group.

    ```mlir
    %dx = piper.cp_gather_grad %dall {cp = 2 : i64, seq = 8 : i64} : (tensor<16x16xf32>) -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpSplitOp : Piper_ComputeOp<"cp_split", [Pure,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "This context-parallel member's rows of the whole sequence";
  let description = [{
    `input` [cp n, C] in sequence order (an MoE layer's output on the
    gathered sequence); `result` [n, C] this member's rows (chunks m and
    2 cp - 1 - m of each sequence; the member comes from the runtime). No
    communication. Its gradient is `piper.cp_split_grad`.

    ```mlir
    %y = piper.cp_split %all {cp = 2 : i64, seq = 8 : i64} : (tensor<16x16xf32>) -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpSplitGradOp : Piper_ComputeOp<"cp_split_grad", [Pure,
    HasParent<"SegmentOp">]> {
  let summary = "Gradient of cp_split: the member's rows in place, zeros elsewhere";
  let description = [{
    `input` [n, C] this member's rows; `result` [cp n, C] in sequence
    order, zero in the other members' rows.

    ```mlir
    %dall = piper.cp_split_grad %dy {cp = 2 : i64, seq = 8 : i64} : (tensor<8x16xf32>) -> tensor<16x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$seq);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpAllGatherOp : Piper_Op<"cp_all_gather", [HasParent<"SegmentOp">,
    Piper_SegmentCollectiveOpInterface]> {
  let extraClassDeclaration = Piper_SegmentCollective<"cp", "AllGather">.decl;
  let summary = "Where the context-parallel lowering cuts a segment for an all-gather";
  let description = [{
    `result` [cp n, C]: the members' `input` [n, C] in member order. A
    marker of `piper.cp_gather`'s lowering; it cuts the segment and
    becomes a `piper.all_gather` over the context-parallel groups, on the
    context-parallel stream.

    ```mlir
    %all = piper.cp_all_gather %x {cp = 2 : i64} : (tensor<8x16xf32>) -> tensor<16x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CpReduceScatterOp : Piper_Op<"cp_reduce_scatter", [HasParent<"SegmentOp">,
    Piper_SegmentCollectiveOpInterface]> {
  let extraClassDeclaration =
      Piper_SegmentCollective<"cp", "ReduceScatter">.decl;
  let summary = "Where the context-parallel lowering cuts a segment for a reduce-scatter";
  let description = [{
    `result` [n, C]: member m's block of the sum over the members of
    `input` [cp n, C]. A marker of `piper.cp_gather_grad`'s lowering; it
    becomes a `piper.reduce_scatter` over the context-parallel groups.

    ```mlir
    %dx = piper.cp_reduce_scatter %d {cp = 2 : i64} : (tensor<16x16xf32>) -> tensor<8x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

#endif // PIPER_CP_OPS
