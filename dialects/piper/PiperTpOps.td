// Tensor and sequence parallelism's markers (docs/tensor-parallel.md):
// Megatron's f and g and the sequence-parallel row collectives, which the
// tensor-parallel rewrite inserts into the forward model and autodiff
// differentiates; after placement they become collectives.
#ifndef PIPER_TP_OPS
#define PIPER_TP_OPS

def Piper_TpCopyOp : Piper_Op<"tp_copy", [Pure, SameOperandsAndResultType,
    HasParent<"SegmentOp">,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Tensor parallelism's f: the identity, whose gradient is summed";
  let description = [{
    Megatron's `f` (docs/tensor-parallel.md): the input of a
    column-parallel layer, which every member of the tensor-parallel group
    holds whole. The identity forward; its gradient, each member's partial
    input gradient, is summed over the group (`piper.tp_reduce`). The
    tensor-parallel rewrite erases it once autodiff has read it.

    ```mlir
    %x1 = piper.tp_copy %x : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Piper_TpReduceOp : Piper_Op<"tp_reduce", [Pure, SameOperandsAndResultType,
    HasParent<"SegmentOp">, Piper_SegmentCollectiveOpInterface,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Tensor parallelism's g: the sum over the tensor-parallel group";
  let description = [{
    Megatron's `g` (docs/tensor-parallel.md): the output of a row-parallel
    layer, a partial sum on each member of the tensor-parallel group, summed
    over the group; its gradient is the identity. In backward segments it
    sums the partial input gradients of column-parallel layers (the
    gradient of `piper.tp_copy`). Never lowered: the tensor-parallel rewrite
    cuts the segment around it and makes it a value `piper.all_reduce` over
    the group, on the stream the directive names.

    ```mlir
    %y = piper.tp_reduce %partial : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
  let extraClassDeclaration = Piper_SegmentCollective<"tp", "AllReduce">.decl;
}


//===----------------------------------------------------------------------===//
// Sequence parallelism (docs/tensor-parallel.md): the parts of a block that
// tensor parallelism leaves replicated (norms, residual adds, biases) run on
// each member's rows; `members` is the tensor-parallel degree T, and member
// m holds rows [m N / T, (m + 1) N / T) of an N-row value.
//===----------------------------------------------------------------------===//

class Piper_SpRowsOp<string mnemonic, list<Trait> traits = []>
    : Piper_Op<mnemonic, !listconcat(traits, [Pure, HasParent<"SegmentOp">,
        DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>])> {
  let arguments = (ins F32Tensor2D:$input, I64Attr:$members);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_SpAllGatherOp : Piper_SpRowsOp<"sp_all_gather",
    [Piper_SegmentCollectiveOpInterface]> {
  let extraClassDeclaration = Piper_SegmentCollective<"tp", "AllGather">.decl;
  let summary = "Sequence parallelism's f: gathers the members' rows";
  let description = [{
    Megatron's `f` under sequence parallelism: the input of a
    column-parallel layer, each member's rows [N / T, M], concatenated in
    member order into [N, M]; its gradient is a reduce-scatter
    (`piper.sp_reduce_scatter`). Lowered, after placement, to a value
    `piper.all_gather` over each tensor-parallel group.

    ```mlir
    %x = piper.sp_all_gather %rows {members = 2 : i64} : (tensor<64x64xf32>) -> tensor<128x64xf32>
    ```
  }];
}

def Piper_SpReduceScatterOp : Piper_SpRowsOp<"sp_reduce_scatter",
    [Piper_SegmentCollectiveOpInterface]> {
  let extraClassDeclaration =
      Piper_SegmentCollective<"tp", "ReduceScatter">.decl;
  let summary = "Sequence parallelism's g: sums over the group, keeps own rows";
  let description = [{
    Megatron's `g` under sequence parallelism: a row-parallel layer's
    partial output [N, M] summed over the group, member m keeping rows m of
    the sum [N / T, M]; its gradient is an all-gather
    (`piper.sp_all_gather`). Lowered to a value `piper.reduce_scatter`.

    ```mlir
    %y = piper.sp_reduce_scatter %partial {members = 2 : i64} : (tensor<128x64xf32>) -> tensor<64x64xf32>
    ```
  }];
}

def Piper_SpSplitOp : Piper_SpRowsOp<"sp_split",
    [Piper_CostOpInterface]> {
  let summary = "Enters the sequence-parallel region: keeps this member's rows";
  let description = [{
    A value every member holds whole (the embedding's output) entering a
    sequence-parallel block: member m keeps rows m of T. No communication:
    the kernel reads the member from the runtime (docs/kernels.md). Its
    gradient gathers the members' row gradients (`piper.sp_gather`).

    ```mlir
    %rows = piper.sp_split %x {members = 2 : i64} : (tensor<128x64xf32>) -> tensor<64x64xf32>
    ```
  }];
}

def Piper_SpGatherOp : Piper_SpRowsOp<"sp_gather",
    [Piper_SegmentCollectiveOpInterface]> {
  let extraClassDeclaration = Piper_SegmentCollective<"tp", "AllGather">.decl;
  let summary = "Leaves the sequence-parallel region: gathers the rows";
  let description = [{
    A sequence-parallel value read by a part every member computes whole
    (the final norm's consumer, the LM head): the members' rows
    concatenated. Every member then computes the same gradient of the whole
    value, so the gradient keeps this member's rows (`piper.sp_split`).
    Lowered to a value `piper.all_gather`.

    ```mlir
    %x = piper.sp_gather %rows {members = 2 : i64} : (tensor<64x64xf32>) -> tensor<128x64xf32>
    ```
  }];
}

//===----------------------------------------------------------------------===//
// Vocabulary parallelism (docs/tensor-parallel.md §5c): the token embedding
// and the LM head split by vocabulary rows over the tensor-parallel group;
// member m of T holds ids [m V, (m + 1) V) of the global vocabulary (V the
// local size). The loss is never computed on gathered logits: each member
// reduces its columns to per-row statistics, which a `piper.tp_reduce`
// sums over the group.
//===----------------------------------------------------------------------===//

def Piper_VocabCeStatsOp : Piper_ComputeOp<"vocab_ce_stats", [Pure]> {
  let summary = "A member's softmax statistics of its vocabulary columns";
  let description = [{
    `logits` [N, V] are columns [m V, (m + 1) V) of the whole logits on
    member m of `members` T (the member comes from the runtime); `targets`
    [B, S] hold global ids. The result [N, 4T + 1] is zero except, per
    row, column m (the local maximum), columns T + m, 2T + m and 3T + m
    (the sum of exp(logit - maximum) over the local columns, as three terms
    whose first two are bf16 values: bf16 storage in mixed precision keeps
    it whole) and, where the target is a local id, column 4T (its logit). Summed over the members (a
    `piper.tp_reduce`, exact: each column has one non-zero term), it holds
    every member's statistics. No gradient: `piper.vocab_cross_entropy`
    differentiates the logits directly.

    ```mlir
    %s = piper.vocab_ce_stats %logits, %targets {members = 2 : i64} : (tensor<128x128xf32>, tensor<4x32xi32>) -> tensor<128x9xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2D:$targets,
                       I64Attr:$members);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_VocabCrossEntropyOp : Piper_ComputeOp<"vocab_cross_entropy", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["isLoss"]>]> {
  let summary = "Mean cross entropy from the summed vocabulary statistics";
  let description = [{
    The mean over the N rows of log-sum-exp - target logit, the
    log-sum-exp over the whole vocabulary read from `stats` (the members'
    `piper.vocab_ce_stats`, summed): M + log(sum_j s_j exp(m_j - M)), M
    the largest member maximum, s_j the sum of member j's three terms.
    Every member computes the same loss.
    `logits` and `targets` are this member's, read only by the gradient
    (`piper.vocab_cross_entropy_grad`), which needs no communication.

    ```mlir
    %loss = piper.vocab_cross_entropy %s, %logits, %targets {members = 2 : i64} : (tensor<128x9xf32>, tensor<128x128xf32>, tensor<4x32xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$stats, F32Tensor2D:$logits,
                       I32Tensor2D:$targets, I64Attr:$members);
  let results = (outs F32Scalar:$loss);
  let assemblyFormat = "$stats `,` $logits `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_VocabCrossEntropyGradOp : Piper_ComputeOp<"vocab_cross_entropy_grad", [Pure]> {
  let summary = "A member's columns of the cross entropy's logit gradient";
  let description = [{
    `dlogits = (exp(logits - lse) - onehot(targets)) / N` on this member's
    columns (the one-hot only where the target is a local id), `lse` each
    row's log-sum-exp from the summed statistics, times the loss seed that
    the runtime fills in (as for `piper.cross_entropy_grad`).
  }];
  let arguments = (ins F32Tensor2D:$stats, F32Tensor2D:$logits,
                       I32Tensor2D:$targets, I64Attr:$members);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$stats `,` $logits `,` $targets attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Replicated key/value heads (docs/tensor-parallel.md §2b): with fewer
// key/value heads K than members T (T = r K), the r members of a kv group
// share one key/value head. The fused q|k|v weight stays sliced T ways
// (member m holds 1/r of the columns of head m / r in k and in v: its
// "piece", p = hd / r columns each); before the column-parallel GEMM each
// member gathers the pieces (`piper.columns`, `piper.sp_all_gather`) and
// assembles its head whole (`piper.tp_kv_assemble`). The gradient goes back
// the same way: the members' partial gradients of a head are summed by the
// all-gather's reduce-scatter, so every member's piece gets the whole
// gradient.
//===----------------------------------------------------------------------===//

def Piper_ColumnsOp : Piper_ComputeOp<"columns", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Consecutive columns of a matrix";
  let description = [{
    `result[i, j] = input[i, start + j]` for the result's columns. Its
    gradient is `piper.columns_grad`.

    ```mlir
    %kv = piper.columns %w {start = 32 : i64} : (tensor<64x48xf32>) -> tensor<64x16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$start);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_ColumnsGradOp : Piper_ComputeOp<"columns_grad", [Pure]> {
  let summary = "A matrix that is zero except for consecutive columns";
  let description = [{
    The gradient of `piper.columns`: `result[i, start + j] = input[i, j]`,
    zero in every other column.

    ```mlir
    %dw = piper.columns_grad %dkv {start = 32 : i64} : (tensor<64x16xf32>) -> tensor<64x48xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$start);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_TpKvAssembleOp : Piper_ComputeOp<"tp_kv_assemble", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "A member's q|k|v weight with its key/value head whole";
  let description = [{
    `weight` [h, q + 2p] is member m's slice of a fused q|k|v weight (q its
    query columns, then its pieces of k and v), `pieces` [T h, 2p] the
    members' k|v pieces gathered in member order. The result [h, q + 2 hd]
    (hd = r p) is the member's query columns, then key/value head
    g = m / r whole: its k columns are the k pieces of members g r ..
    g r + r - 1 side by side, then its v columns likewise. `members` is T,
    `query` q; the member comes from the runtime. The gradient of
    `weight` is the result gradient's query columns
    (`piper.columns`, `piper.columns_grad`), that of `pieces`
    `piper.tp_kv_assemble_grad`.

    ```mlir
    %w = piper.tp_kv_assemble %wl, %all {members = 4 : i64, query = 16 : i64} : (tensor<64x24xf32>, tensor<256x8xf32>) -> tensor<64x32xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$weight, F32Tensor2D:$pieces,
                       I64Attr:$members, I64Attr:$query);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$weight `,` $pieces attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_TpKvAssembleGradOp : Piper_ComputeOp<"tp_kv_assemble_grad", [Pure]> {
  let summary = "The gathered pieces' gradient of tp_kv_assemble";
  let description = [{
    `input` [h, q + 2 hd] is the gradient of `piper.tp_kv_assemble`'s
    result; the result [T h, 2p] (p = hd / r) is zero except the rows of
    the members g r .. g r + r - 1 that share this member's key/value head
    g: their pieces' columns of the head's gradient. Summed over the
    members (the gathered pieces' reduce-scatter), each member's piece
    gets the gradient of every query head that reads it.

    ```mlir
    %d = piper.tp_kv_assemble_grad %dw {members = 4 : i64, query = 16 : i64} : (tensor<64x32xf32>) -> tensor<256x8xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I64Attr:$members, I64Attr:$query);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

#endif // PIPER_TP_OPS
