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
    piper-tensor-parallel lowers it to `cp` `piper.attention_block` kernels
    with the key/value shards passed around the ring between them
    (`piper.cp_ring_shift`).

    ```mlir
    %y, %lse = piper.cp_attention %qkv {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64} : (tensor<64x192xf32>) -> (tensor<64x64xf32>, tensor<64x8xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, I64Attr:$heads, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp);
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
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp);
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
                       I64Attr:$step);
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

    ```mlir
    %dq, %dkv = piper.attention_block_grad %qkv, %kv, %y, %lse, %dy {cp = 2 : i64, heads = 4 : i64, seq = 32 : i64, step = 0 : i64} : (tensor<64x192xf32>, tensor<64x128xf32>, tensor<64x64xf32>, tensor<64x8xf32>, tensor<64x64xf32>) -> (tensor<64x64xf32>, tensor<64x128xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$kv, F32Tensor2D:$y,
                       F32Tensor2D:$lse, F32Tensor2D:$grad,
                       Variadic<F32Tensor2D>:$carry, I64Attr:$heads,
                       I64Attr:$seq, OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta, I64Attr:$cp,
                       I64Attr:$step);
  let results = (outs F32Tensor2D:$dq, F32Tensor2D:$dkv);
  let assemblyFormat = [{
    $qkv `,` $kv `,` $y `,` $lse `,` $grad (`,` $carry^)? attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Piper_CpRingShiftOp : Piper_Op<"cp_ring_shift", [Pure,
    SameOperandsAndResultType, HasParent<"SegmentOp">]> {
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
  let arguments = (ins F32Tensor2D:$input, I64Attr:$cp, I64Attr:$offset);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let hasVerifier = 1;
}

#endif // PIPER_CP_OPS
