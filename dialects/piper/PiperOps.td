// Ops of the piper dialect: parameters, segments, tensor compute and its
// gradients, and the program-level nodes of the training DAG.
#ifndef PIPER_OPS_TD
#define PIPER_OPS_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/IR/RegionKindInterface.td"
include "mlir/Interfaces/CallInterfaces.td"
include "mlir/Interfaces/FunctionInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"
include "mlir/Interfaces/InferTypeOpInterface.td"
include "mlir/Interfaces/ControlFlowInterfaces.td"
include "PiperDialect.td"
include "PiperInterfaces.td"

class Piper_Op<string mnemonic, list<Trait> traits = []>
    : Op<Piper_Dialect, mnemonic, traits>;

/// A tensor op of a segment, with a cost (FLOPs and bytes moved).
// An op computing a parameter's gradient from activations: split backward
// (BI/BW) defers it, and whatever reads its result, to the BW half.
def Piper_WeightGradient : NativeOpTrait<"WeightGradient"> {
  let cppNamespace = "::mlir::OpTrait::piper";
}

class Piper_ComputeOp<string mnemonic, list<Trait> traits = []>
    : Piper_Op<mnemonic, !listconcat(traits, [Piper_CostOpInterface])>;

// Every tensor of the dialect is statically shaped: shapes are plans.
def F32Tensor2D : ConfinedType<2DTensorOf<[F32]>, [HasStaticShapePred],
                               "statically shaped 2-D tensor of f32">;
def F32Tensor1D : ConfinedType<1DTensorOf<[F32]>, [HasStaticShapePred],
                               "statically shaped 1-D tensor of f32">;
def F32Scalar : 0DTensorOf<[F32]>;
def I32Tensor2D : ConfinedType<2DTensorOf<[I32]>, [HasStaticShapePred],
                               "statically shaped 2-D tensor of i32">;

/// An i64 attribute that may be negative (a ring offset): upstream's
/// I64Attr hands back uint64_t, which reads -1 as 2^64 - 1.
def Piper_SignedI64Attr : TypedSignlessIntegerAttrBase<I64, "int64_t",
    "64-bit signless integer attribute read as signed"> {
  let convertFromStorage = "$_self.getValue().getSExtValue()";
}

//===----------------------------------------------------------------------===//
// Module level: parameters and segments
//===----------------------------------------------------------------------===//

def Piper_ParamOp : Piper_Op<"param", [Symbol]> {
  let summary = "Declares a trainable parameter with its global shape";
  let description = [{
    A parameter of the model, declared once at module level with its full
    (global, unsharded) shape, its dtype and its initializer. Segments read it
    with `piper.param_ref`. Initial values are a pure function of (seed,
    parameter name, element index), so every strategy starts from the same
    numbers. Expert parallelism (`shard`) makes an expert weight local:
    with `expert_members = G` the type holds one member's experts (the
    global tensor has G times its first dimension), member i of each
    expert-parallel group holding the i-th block. Tensor parallelism
    (`shard_tensor`) makes a weight a `tensor_slice`: the type holds one
    member's slice.

    ```mlir
    piper.param @h0.attn.w : tensor<64x192xf32> init normal(2.0e-02)
    piper.param @h0.ln1.g : tensor<64xf32> init ones(0.0)
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<AnyRankedTensor>:$type,
                       Piper_InitKindAttr:$init,
                       F64Attr:$scale,
                       OptionalAttr<ConfinedAttr<I64Attr, [IntMinValue<2>]>>:$expert_members,
                       OptionalAttr<Piper_TensorSliceAttr>:$tensor_slice);
  let assemblyFormat = "$sym_name `:` $type `init` `` $init `(` $scale `)` attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::mlir::RankedTensorType getTensorType() {
      return ::llvm::cast<::mlir::RankedTensorType>(getType());
    }
  }];
}

def Piper_SegmentOp : Piper_Op<"segment", [
    FunctionOpInterface, IsolatedFromAbove, Symbol, SingleBlock]> {
  let summary = "A function-like body of tensor ops run by one task";
  let description = [{
    A segment holds op-level compute: the ops of one model region (a block, a
    pipeline stage), or its backward, or its optimizer update. It is isolated
    from above; parameters are reached by symbol through `piper.param_ref`,
    `piper.accumulate_grad` and `piper.adamw`. Its single block ends in
    `piper.yield`. The discardable `piper.block` attribute (model region
    index, an integer) and `piper.pass` attribute (`#piper.pass<F>`, `B`,
    `U`) say where it came from; the dialect verifies their types.

    ```mlir
    piper.segment @block0(%x: tensor<128x64xf32>) -> tensor<128x64xf32> {
      %w = piper.param_ref @h0.mlp.w : tensor<64x64xf32>
      %y = piper.linear %x, %w : (tensor<128x64xf32>, tensor<64x64xf32>) -> tensor<128x64xf32>
      piper.yield %y : tensor<128x64xf32>
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<FunctionType>:$function_type,
                       OptionalAttr<DictArrayAttr>:$arg_attrs,
                       OptionalAttr<DictArrayAttr>:$res_attrs);
  let regions = (region SizedRegion<1>:$body);
  let hasCustomAssemblyFormat = 1;
  let hasVerifier = 1;
  let builders = [OpBuilder<(ins "::llvm::StringRef":$name,
                                 "::mlir::FunctionType":$type)>];
  let extraClassDeclaration = [{
    ::mlir::Region *getCallableRegion() { return &getBody(); }
    ::llvm::ArrayRef<::mlir::Type> getArgumentTypes() {
      return getFunctionType().getInputs();
    }
    ::llvm::ArrayRef<::mlir::Type> getResultTypes() {
      return getFunctionType().getResults();
    }
  }];
}

def Piper_YieldOp : Piper_Op<"yield", [Pure, Terminator, ReturnLike,
                                       HasParent<"SegmentOp">]> {
  let summary = "Returns the results of a segment";
  let description = [{
    Ends a segment's single block, returning its results (types as in
    the segment's function type). Nothing else terminates a segment.

    ```mlir
    piper.yield %y, %x : tensor<128x64xf32>, tensor<128x64xf32>
    ```
  }];
  let arguments = (ins Variadic<AnyType>:$values);
  let assemblyFormat = "attr-dict ($values^ `:` type($values))?";
  let hasVerifier = 1;
}

def Piper_ParamRefOp : Piper_Op<"param_ref", [Pure,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Reads a parameter inside a segment";
  let description = [{
    The current value of parameter `param` (a module-level
    `piper.param`), with the parameter's type. In bf16 plans the runtime
    hands kernels its bf16 compute copy. A parameter cannot be a segment
    result: segments return activations only.

    ```mlir
    %w = piper.param_ref @h0.mlp.w : tensor<64x256xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "$param attr-dict `:` type($result)";
}

//===----------------------------------------------------------------------===//
// Forward compute. Activations are 2-D [N, H] with N = B*S rows (a microbatch
// of B sequences of S tokens, flattened); token ids are [B, S] i32.
//===----------------------------------------------------------------------===//

def Piper_EmbeddingOp : Piper_ComputeOp<"embedding", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "Token embedding lookup: y[b*S+s] = table[ids[b, s]]";
  let description = [{
    `ids` is [B, S] i32, `table` is [V, H]; the result is [B*S, H],
    row b*S+s holding `table[ids[b, s]]`. An id outside [0, V) is a
    run-time error naming it.

    With `members` T (vocabulary parallelism, docs/tensor-parallel.md
    §5c), `table` is member m's rows [m V, (m + 1) V) of a global [T V, H]
    table (the member comes from the runtime): an id outside them gives a
    zero row, and a `piper.tp_reduce` sums the members' results. An id
    outside [0, T V) is a run-time error.

    ```mlir
    %x = piper.embedding %ids, %wte : (tensor<4x32xi32>, tensor<256x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins I32Tensor2D:$ids, F32Tensor2D:$table,
                       OptionalAttr<I64Attr>:$members);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$ids `,` $table attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_PositionAddOp : Piper_ComputeOp<"position_add", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "Adds learned positions: y[n] = x[n] + pos[n mod seq]";
  let description = [{
    Adds a learned position embedding `pos` [P, H] (P >= seq) to
    `input` [N, H], where row n is position n mod `seq` of its sequence.
    With `cp` (context parallelism, docs/context-parallel.md), `input`
    holds a context member's seq / cp rows of each sequence, its chunks m
    and 2 cp - 1 - m of 2 cp (the member comes from the runtime), and each
    row adds its global position.

    ```mlir
    %y = piper.position_add %x, %wpe {seq = 32 : i64} : (tensor<128x64xf32>, tensor<32x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$pos, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$cp);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $pos attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_LayerNormOp : Piper_ComputeOp<"layer_norm", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "Layer normalization over the last dimension, with affine";
  let description = [{
    Per row: y = (x - mean) / sqrt(var + eps) * gamma + beta, with the
    biased variance, as torch.nn.LayerNorm.

    ```mlir
    %y = piper.layer_norm %x, %g, %b : (tensor<128x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor1D:$gamma,
                       F32Tensor1D:$beta, DefaultValuedAttr<F64Attr, "1e-5">:$eps);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $gamma `,` $beta attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_LinearOp : Piper_Op<"linear", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "Dense layer: y = x·w (+ b), or x·wᵀ with transpose_w";
  let description = [{
    `x` is [N, K]; `w` is [K, M], or [M, K] with `transpose_w` (a head tied to
    the embedding table); the optional bias is [M]; the result is [N, M].
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$weight,
                       Optional<F32Tensor1D>:$bias, UnitAttr:$transpose_w);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_GeluOp : Piper_ComputeOp<"gelu", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "GELU, tanh approximation (as GPT-2)";
  let description = [{
    y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), elementwise, as
    GPT-2 and torch's `gelu(approximate="tanh")`.

    ```mlir
    %y = piper.gelu %x : tensor<128x256xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` type($result)";
}

def Piper_AddOp : Piper_ComputeOp<"add", [Pure, SameOperandsAndResultType,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Elementwise sum (residual connections, gradient fan-in)";
  let description = [{
    Elementwise `lhs + rhs` of two tensors of one type: residual
    connections, and in backward segments the sum of the gradients of a
    value read twice.

    ```mlir
    %y = piper.add %x, %r : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$lhs, F32Tensor2D:$rhs);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$lhs `,` $rhs attr-dict `:` type($result)";
}

def Piper_BiasAddOp : Piper_ComputeOp<"bias_add", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "Adds a bias to every row: y = x + b";
  let description = [{
    `x` [N, M] plus `b` [M] on every row. Tensor parallelism adds a
    row-parallel layer's bias with it, once, after the sum over the group
    (docs/tensor-parallel.md); its gradient is `dy` for `x` and
    `bias_grad(dy)` for `b`.

    ```mlir
    %y = piper.bias_add %x, %b : (tensor<128x64xf32>, tensor<64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor1D:$bias);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $bias attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_AttentionOp : Piper_Op<"attention", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Causal multi-head self-attention over packed q|k|v";
  let description = [{
    Each row of `qkv` holds q (heads * hd), then k and v (kv_heads * hd each;
    `kv_heads` defaults to `heads`, fewer gives grouped-query attention, query
    head h reading kv head h / (heads / kv_heads)). Each of the N / seq
    sequences attends causally within itself, scaled by 1/sqrt(hd). With
    `rope_theta`, q and k are rotated first (rotary embeddings, Llama's
    rotate-half convention, position = row index within the sequence),
    with `rope_scaling` at Llama 3.1's rescaled frequencies. The
    result is [N, heads * hd]; `lse` [N, 2 heads] is the log-sum-exp of
    each row's scaled scores, saved for the backward (the fused kernels'
    softmax statistics) as a pair per head: column h a bf16 value, column
    heads + h the rest, so that bf16 storage keeps it to |lse| 2^-16 (as
    `piper.cp_attention`'s).

    ```mlir
    %y, %lse = piper.attention %qkv {heads = 4 : i64, seq = 32 : i64} : (tensor<128x192xf32>) -> (tensor<128x64xf32>, tensor<128x8xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, I64Attr:$heads, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta,
                       OptionalAttr<Piper_RopeScalingAttr>:$rope_scaling);
  let results = (outs F32Tensor2D:$result, F32Tensor2D:$lse);
  let assemblyFormat = "$qkv attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumKvHeads() { return getKvHeads().value_or(getHeads()); }
  }];
}

def Piper_RmsNormOp : Piper_ComputeOp<"rms_norm", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "RMS normalization over the last dimension, with a gain";
  let description = [{
    y = x / sqrt(mean(x²) + eps) * gamma, as Llama's RMSNorm.
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor1D:$gamma,
                       DefaultValuedAttr<F64Attr, "1e-6">:$eps);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $gamma attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_QkNormOp : Piper_ComputeOp<"qk_norm", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "RMS normalization of each query and key head of packed q|k|v";
  let description = [{
    Qwen3's per-head q/k norm. Each row of `qkv` holds q (heads * hd), then
    k and v (kv_heads * hd each; `kv_heads` defaults to `heads`), as
    `piper.attention` reads them. Every hd-wide query head is RMS-normalized
    and scaled by `gamma[0:hd]`, every key head by `gamma[hd:2hd]`; v is
    copied. `gamma` is [2 * hd]: the q norm's weight, then the k norm's.

    ```mlir
    %y = piper.qk_norm %qkv, %g {heads = 4 : i64, kv_heads = 2 : i64} : (tensor<128x128xf32>, tensor<32xf32>) -> tensor<128x128xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor1D:$gamma, I64Attr:$heads,
                       OptionalAttr<I64Attr>:$kv_heads,
                       DefaultValuedAttr<F64Attr, "1e-6">:$eps);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$qkv `,` $gamma attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    int64_t getNumKvHeads() { return getKvHeads().value_or(getHeads()); }
  }];
}

def Piper_SwigluOp : Piper_ComputeOp<"swiglu", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "SwiGLU: silu(gate) * up over packed [gate | up] columns";
  let description = [{
    `input` is [N, 2F]: columns 0..F-1 are the gate g, F..2F-1 the up
    projection u; the result is [N, F] with silu(g) * u, as Llama's MLP.

    ```mlir
    %h = piper.swiglu %gu : (tensor<128x512xf32>) -> tensor<128x256xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_CrossEntropyOp : Piper_ComputeOp<"cross_entropy", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["isLoss"]>]> {
  let summary = "Mean softmax cross-entropy of logits [N, V] against targets [B, S]";
  let description = [{
    `logits` [B*S, V] against `targets` [B, S] i32: the mean over the
    B*S rows of -log softmax(logits)[target] (the log-sum-exp accumulates
    in double). A target outside [0, V) is a run-time error.

    ```mlir
    %loss = piper.cross_entropy %logits, %targets : (tensor<128x256xf32>, tensor<4x32xi32>) -> tensor<f32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2D:$targets);
  let results = (outs F32Scalar:$loss);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

//===----------------------------------------------------------------------===//
// Gradients. Input and weight gradients are separate ops so that zero-bubble
// schedules can split a backward pass into BI and BW.
//===----------------------------------------------------------------------===//

def Piper_EmbeddingGradOp : Piper_ComputeOp<"embedding_grad", [Pure, Piper_WeightGradient]> {
  let summary = "Table gradient of embedding: scatter-add of dy rows by id";
  let description = [{
    The gradient of `piper.embedding` with respect to its table: a
    [V, H] tensor (V from the result type) where row v sums the rows of
    `grad` [B*S, H] whose id is v. Ids are not differentiable. With
    `members` (vocabulary parallelism), row v is id m V + v of member m,
    and rows of other members' ids are skipped.

    ```mlir
    %dwte = piper.embedding_grad %ids, %dx : (tensor<4x32xi32>, tensor<128x64xf32>) -> tensor<256x64xf32>
    ```
  }];
  let arguments = (ins I32Tensor2D:$ids, F32Tensor2D:$grad,
                       OptionalAttr<I64Attr>:$members);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$ids `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_PositionAddGradOp : Piper_ComputeOp<"position_add_grad", [Pure, Piper_WeightGradient]> {
  let summary = "Position-table gradient: dpos[s] = sum of dy rows n with n mod seq = s";
  let description = [{
    The gradient of `piper.position_add` with respect to the position
    table (the input's gradient is `grad` itself): row s of the [P, H]
    result sums the rows n of `grad` with n mod `seq` = s (zero for s >=
    seq). With `cp`, as `piper.position_add`'s: the member's rows go to
    their global positions, the other members' positions get zeros.

    ```mlir
    %dwpe = piper.position_add_grad %dy {seq = 32 : i64} : (tensor<128x64xf32>) -> tensor<32x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$grad, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$cp);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$grad attr-dict `:` functional-type(operands, results)";
}

def Piper_LayerNormGradInputOp : Piper_ComputeOp<"layer_norm_grad_input", [Pure]> {
  let summary = "Input gradient of layer_norm (input gradient; the BI half of its backward)";
  let description = [{
    dx of `piper.layer_norm` from its `input`, `gamma` and the output
    gradient `grad` (the statistics are recomputed). Separate from the
    gamma/beta gradients so that a split backward can run it as BI.

    ```mlir
    %dx = piper.layer_norm_grad_input %x, %g, %dy : (tensor<128x64xf32>, tensor<64xf32>, tensor<128x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor1D:$gamma, F32Tensor2D:$grad,
                       DefaultValuedAttr<F64Attr, "1e-5">:$eps);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $gamma `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_LayerNormGradWeightOp : Piper_ComputeOp<"layer_norm_grad_weight", [Pure, Piper_WeightGradient]> {
  let summary = "Gamma and beta gradients of layer_norm (the BW half)";
  let description = [{
    dgamma = sum over rows of grad * xhat, dbeta = sum over rows of
    grad, with xhat the normalized input (recomputed from `input`).

    ```mlir
    %dg, %db = piper.layer_norm_grad_weight %x, %dy : (tensor<128x64xf32>, tensor<128x64xf32>) -> (tensor<64xf32>, tensor<64xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad,
                       DefaultValuedAttr<F64Attr, "1e-5">:$eps);
  let results = (outs F32Tensor1D:$dgamma, F32Tensor1D:$dbeta);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_LinearGradInputOp : Piper_Op<"linear_grad_input", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>]> {
  let summary = "Input gradient of linear: dx = dy·wᵀ (dy·w with transpose_w)";
  let description = [{
    For y = x·w: dx = dy·wᵀ; with `transpose_w` (y = x·wᵀ, a tied head)
    dx = dy·w.

    ```mlir
    %dx = piper.linear_grad_input %dy, %w : (tensor<128x256xf32>, tensor<64x256xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$grad, F32Tensor2D:$weight, UnitAttr:$transpose_w);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$grad `,` $weight attr-dict `:` functional-type(operands, results)";
}

def Piper_LinearGradWeightOp : Piper_Op<"linear_grad_weight", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>, Piper_WeightGradient]> {
  let summary = "Weight gradient of linear: dw = xᵀ·dy (dyᵀ·x with transpose_w)";
  let description = [{
    For y = x·w: dw = xᵀ·dy ([K, M]); with `transpose_w` dw = dyᵀ·x
    ([M, K], the layout of the tied table). The BW half of a linear's
    backward.

    ```mlir
    %dw = piper.linear_grad_weight %x, %dy : (tensor<128x64xf32>, tensor<128x256xf32>) -> tensor<64x256xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad, UnitAttr:$transpose_w);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_LinearGradWeightBiasOp : Piper_Op<"linear_grad_weight_bias", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>, Piper_WeightGradient]> {
  let summary = "A biased linear's weight and bias gradients in one product";
  let description = [{
    `linear_grad_weight` and `bias_grad` of the same `grad`, in one op: dw
    as `linear_grad_weight` computes it, db the column sums of `grad` as
    `bias_grad` computes them (the same numbers on the CPU). On CUDA the
    bias gradient comes out of the weight gradient's GEMM (cuBLASLt's
    BGRADA/BGRADB epilogue): `grad` is read once. Emitted by autodiff for
    a `linear` with a bias when both gradients are needed, unless
    `piperc compile --no-fused-epilogues`.

    ```mlir
    %dw, %db = piper.linear_grad_weight_bias %x, %dy : (tensor<128x64xf32>, tensor<128x256xf32>) -> (tensor<64x256xf32>, tensor<256xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad, UnitAttr:$transpose_w);
  let results = (outs F32Tensor2D:$result, F32Tensor1D:$bias_grad);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_BiasGradOp : Piper_ComputeOp<"bias_grad", [Pure, Piper_WeightGradient]> {
  let summary = "Bias gradient: column sums of dy";
  let description = [{
    The gradient of a linear's bias: the sum of the rows of `grad`.

    ```mlir
    %db = piper.bias_grad %dy : (tensor<128x256xf32>) -> tensor<256xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$grad);
  let results = (outs F32Tensor1D:$result);
  let assemblyFormat = "$grad attr-dict `:` functional-type(operands, results)";
}

def Piper_GeluGradOp : Piper_ComputeOp<"gelu_grad", [Pure, SameOperandsAndResultType]> {
  let summary = "Input gradient of gelu";
  let description = [{
    dx = grad * gelu'(input), with the derivative of the tanh
    approximation.

    ```mlir
    %dx = piper.gelu_grad %x, %dy : tensor<128x256xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` type($result)";
}

def Piper_AttentionGradOp : Piper_Op<"attention_grad", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>]> {
  let summary = "Gradient of attention w.r.t. packed q|k|v";
  let description = [{
    The gradient of `piper.attention` with respect to its packed `qkv`
    input, for the output gradient `grad`, from the forward's `qkv`, `y`
    and `lse`; the attributes must equal the forward's. The fused kernels
    (cuDNN) take y and the statistics as they are; the CPU and SIMT GPU
    kernels recompute the softmax from `qkv`, as they always have. With
    `rope_theta` the rotation is undone on the q and k gradients.

    ```mlir
    %dqkv = piper.attention_grad %qkv, %y, %lse, %dy {heads = 4 : i64, seq = 32 : i64} : (tensor<128x192xf32>, tensor<128x64xf32>, tensor<128x8xf32>, tensor<128x64xf32>) -> tensor<128x192xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$y, F32Tensor2D:$lse,
                       F32Tensor2D:$grad, I64Attr:$heads,
                       I64Attr:$seq, OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta,
                       OptionalAttr<Piper_RopeScalingAttr>:$rope_scaling);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = [{
    $qkv `,` $y `,` $lse `,` $grad attr-dict `:` functional-type(operands, results)
  }];
  let hasVerifier = 1;
}

def Piper_RmsNormGradInputOp : Piper_ComputeOp<"rms_norm_grad_input", [Pure]> {
  let summary = "Input gradient of rms_norm (input gradient; the BI half of its backward)";
  let description = [{
    dx of `piper.rms_norm` from its `input`, `gamma` and the output
    gradient (the inverse RMS is recomputed): the BI half of its backward.

    ```mlir
    %dx = piper.rms_norm_grad_input %x, %g, %dy : (tensor<128x64xf32>, tensor<64xf32>, tensor<128x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor1D:$gamma, F32Tensor2D:$grad,
                       DefaultValuedAttr<F64Attr, "1e-6">:$eps);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $gamma `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_RmsNormGradWeightOp : Piper_ComputeOp<"rms_norm_grad_weight", [Pure, Piper_WeightGradient]> {
  let summary = "Gain gradient of rms_norm (the BW half)";
  let description = [{
    dgamma = sum over rows of grad * x / sqrt(mean(x²) + eps): the BW
    half of `piper.rms_norm`'s backward.

    ```mlir
    %dg = piper.rms_norm_grad_weight %x, %dy : (tensor<128x64xf32>, tensor<128x64xf32>) -> tensor<64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad,
                       DefaultValuedAttr<F64Attr, "1e-6">:$eps);
  let results = (outs F32Tensor1D:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_QkNormGradInputOp : Piper_ComputeOp<"qk_norm_grad_input", [Pure]> {
  let summary = "Input gradient of qk_norm (the BI half of its backward)";
  let description = [{
    dqkv of `piper.qk_norm` from its `qkv`, `gamma` and the output
    gradient: rms_norm's input gradient on each query and key head, the v
    columns' gradient passed through.

    ```mlir
    %dx = piper.qk_norm_grad_input %qkv, %g, %dy {heads = 4 : i64} : (tensor<128x96xf32>, tensor<16xf32>, tensor<128x96xf32>) -> tensor<128x96xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor1D:$gamma, F32Tensor2D:$grad,
                       I64Attr:$heads, OptionalAttr<I64Attr>:$kv_heads,
                       DefaultValuedAttr<F64Attr, "1e-6">:$eps);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$qkv `,` $gamma `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_QkNormGradWeightOp : Piper_ComputeOp<"qk_norm_grad_weight", [Pure, Piper_WeightGradient]> {
  let summary = "Gain gradient of qk_norm (the BW half)";
  let description = [{
    dgamma [2 * hd]: the sum over rows and query heads of grad * xhat (the
    q norm's weight), then over key heads (the k norm's).

    ```mlir
    %dg = piper.qk_norm_grad_weight %qkv, %dy {heads = 4 : i64} : (tensor<128x96xf32>, tensor<128x96xf32>) -> tensor<16xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$grad, I64Attr:$heads,
                       OptionalAttr<I64Attr>:$kv_heads,
                       DefaultValuedAttr<F64Attr, "1e-6">:$eps);
  let results = (outs F32Tensor1D:$result);
  let assemblyFormat = "$qkv `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_SwigluGradOp : Piper_ComputeOp<"swiglu_grad", [Pure]> {
  let summary = "Gradient of swiglu w.r.t. its packed [gate | up] input";
  let description = [{
    The gradient of `piper.swiglu` with respect to its packed input:
    [N, 2F], d gate in the first F columns and d up in the last F.

    ```mlir
    %dgu = piper.swiglu_grad %gu, %dh : (tensor<128x512xf32>, tensor<128x256xf32>) -> tensor<128x512xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_CrossEntropyGradOp : Piper_ComputeOp<"cross_entropy_grad", [Pure]> {
  let summary = "Gradient of the mean cross entropy w.r.t. logits, times the loss seed";
  let description = [{
    `dlogits = (softmax(logits) - onehot(targets)) / N`, multiplied by the
    loss seed: the weight of this microbatch's loss in the global loss, which
    the runtime fills in as 1 / (microbatches * replicas).
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2D:$targets);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` functional-type(operands, results)";
}

def Piper_CrossEntropyFusedOp : Piper_ComputeOp<"cross_entropy_fused", [Pure]> {
  let summary = "The fused classifier: the loss and its logits gradient in one pass";
  let description = [{
    `piper.cross_entropy` and `piper.cross_entropy_grad` of the same logits
    and targets, computed together (the log-sum-exp of each row once) and
    bit for bit the two ops' results. `piper-build-training-dag` puts it in
    the forward in place of a returned `piper.cross_entropy` whose logits
    the backward would keep: the forward then keeps `dlogits`, the same
    size, instead of the logits (docs/design-notes.md §2). The loss seed is
    filled in as for `cross_entropy_grad`.

    ```mlir
    %loss, %dlogits = piper.cross_entropy_fused %logits, %targets : (tensor<128x256xf32>, tensor<4x32xi32>) -> (tensor<f32>, tensor<128x256xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2D:$targets);
  let results = (outs F32Scalar:$loss, F32Tensor2D:$dlogits);
  let assemblyFormat = "$logits `,` $targets attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

include "PiperMoeOps.td"
include "PiperTpOps.td"
include "PiperCpOps.td"

//===----------------------------------------------------------------------===//
// State: gradient accumulators, the step loss and the optimizer.
//===----------------------------------------------------------------------===//

def Piper_AccumulateGradOp : Piper_Op<"accumulate_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Adds a gradient into the accumulator of a parameter";
  let description = [{
    Adds `grad` (the parameter's type) into the parameter's fp32
    gradient accumulator, which sums over microbatches until an update (or
    the runtime, for plans without one) clears it. Data-parallel and tied
    parameters are then summed by the gradient form of `piper.all_reduce`.

    ```mlir
    piper.accumulate_grad @h0.mlp.w, %dw : tensor<64x256xf32>
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, AnyRankedTensor:$grad);
  let assemblyFormat = "$param `,` $grad attr-dict `:` type($grad)";
}

def Piper_LossAccumulateOp : Piper_Op<"loss_accumulate"> {
  let summary = "Adds this microbatch's weighted loss to the reported step loss";
  let description = [{
    The runtime adds `coeff * loss / (microbatches * replicas)` to the step
    loss; `coeff` weighs auxiliary loss terms (1 for the language-model loss).
  }];
  let arguments = (ins F32Scalar:$loss, DefaultValuedAttr<F64Attr, "1.0">:$coeff);
  let assemblyFormat = "$loss attr-dict `:` type($loss)";
}

def Piper_AdamWOp : Piper_Op<"adamw", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "AdamW update of a parameter from its accumulated gradient";
  let description = [{
    Decoupled weight decay and bias correction, fp32 moments, as
    torch.optim.AdamW. The accumulator is left untouched; `piper.zero_grad`
    clears it.
  }];
  let arguments = (ins FlatSymbolRefAttr:$param, F64Attr:$lr, F64Attr:$beta1,
                       F64Attr:$beta2, F64Attr:$eps, F64Attr:$weight_decay);
  let assemblyFormat = "$param attr-dict";
}

def Piper_ZeroGradOp : Piper_Op<"zero_grad", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Clears the gradient accumulator of a parameter";
  let description = [{
    Sets the parameter's gradient accumulator to zero; update segments
    end with it, after `piper.adamw`, as `optimizer.zero_grad()`.

    ```mlir
    piper.zero_grad @h0.mlp.w
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$param);
  let assemblyFormat = "$param attr-dict";
}

include "PiperProgramOps.td"
include "PiperCommOps.td"

#endif // PIPER_OPS_TD
