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
    numbers.

    ```mlir
    piper.param @h0.attn.w : tensor<64x192xf32> init normal(2.0e-02)
    piper.param @h0.ln1.g : tensor<64xf32> init ones(0.0)
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       TypeAttrOf<AnyRankedTensor>:$type,
                       Piper_InitKindAttr:$init,
                       F64Attr:$scale);
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

    ```mlir
    %x = piper.embedding %ids, %wte : (tensor<4x32xi32>, tensor<256x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins I32Tensor2D:$ids, F32Tensor2D:$table);
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

    ```mlir
    %y = piper.position_add %x, %wpe {seq = 32 : i64} : (tensor<128x64xf32>, tensor<32x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$pos, I64Attr:$seq);
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
    rotate-half convention, position = row index within the sequence). The
    result is [N, heads * hd].
  }];
  let arguments = (ins F32Tensor2D:$qkv, I64Attr:$heads, I64Attr:$seq,
                       OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta);
  let results = (outs F32Tensor2D:$result);
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

def Piper_EmbeddingGradOp : Piper_ComputeOp<"embedding_grad", [Pure]> {
  let summary = "Table gradient of embedding: scatter-add of dy rows by id";
  let description = [{
    The gradient of `piper.embedding` with respect to its table: a
    [V, H] tensor (V from the result type) where row v sums the rows of
    `grad` [B*S, H] whose id is v. Ids are not differentiable.

    ```mlir
    %dwte = piper.embedding_grad %ids, %dx : (tensor<4x32xi32>, tensor<128x64xf32>) -> tensor<256x64xf32>
    ```
  }];
  let arguments = (ins I32Tensor2D:$ids, F32Tensor2D:$grad);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$ids `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_PositionAddGradOp : Piper_ComputeOp<"position_add_grad", [Pure]> {
  let summary = "Position-table gradient: dpos[s] = sum of dy rows n with n mod seq = s";
  let description = [{
    The gradient of `piper.position_add` with respect to the position
    table (the input's gradient is `grad` itself): row s of the [P, H]
    result sums the rows n of `grad` with n mod `seq` = s (zero for s >=
    seq).

    ```mlir
    %dwpe = piper.position_add_grad %dy {seq = 32 : i64} : (tensor<128x64xf32>) -> tensor<32x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$grad, I64Attr:$seq);
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

def Piper_LayerNormGradWeightOp : Piper_ComputeOp<"layer_norm_grad_weight", [Pure]> {
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

def Piper_LinearGradInputOp : Piper_ComputeOp<"linear_grad_input", [Pure]> {
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

def Piper_LinearGradWeightOp : Piper_ComputeOp<"linear_grad_weight", [Pure]> {
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

def Piper_BiasGradOp : Piper_ComputeOp<"bias_grad", [Pure]> {
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

def Piper_AttentionGradOp : Piper_ComputeOp<"attention_grad", [Pure]> {
  let summary = "Gradient of attention w.r.t. packed q|k|v (recomputes the softmax)";
  let description = [{
    The gradient of `piper.attention` with respect to its packed `qkv`
    input, for the output gradient `grad`; the attributes must equal the
    forward's. The softmax is recomputed from `qkv` (nothing else is saved),
    and with `rope_theta` the rotation is undone on the q and k gradients.

    ```mlir
    %dqkv = piper.attention_grad %qkv, %dy {heads = 4 : i64, seq = 32 : i64} : (tensor<128x192xf32>, tensor<128x64xf32>) -> tensor<128x192xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$qkv, F32Tensor2D:$grad, I64Attr:$heads,
                       I64Attr:$seq, OptionalAttr<I64Attr>:$kv_heads,
                       OptionalAttr<F64Attr>:$rope_theta);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$qkv `,` $grad attr-dict `:` functional-type(operands, results)";
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

def Piper_RmsNormGradWeightOp : Piper_ComputeOp<"rms_norm_grad_weight", [Pure]> {
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

//===----------------------------------------------------------------------===//
// Mixture of experts. Routing picks top_k experts per token; dispatch copies
// each (token, choice) into the next free slot of its expert, up to
// `capacity` slots (later assignments are dropped and contribute nothing);
// experts run batched over [experts * capacity] rows; combine sums the
// weighted expert outputs back per token.
//===----------------------------------------------------------------------===//

def I32Tensor2DAny : ConfinedType<2DTensorOf<[I32]>, [HasStaticShapePred],
                                  "statically shaped 2-D tensor of i32">;
def F32Tensor3D : ConfinedType<3DTensorOf<[F32]>, [HasStaticShapePred],
                               "statically shaped 3-D tensor of f32">;

def Piper_MoeRouterOp : Piper_ComputeOp<"moe_router", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Top-k softmax routing: expert indices and gate weights per token";
  let description = [{
    p = softmax(logits); `indices` are the top_k experts by p (descending,
    ties to the lower index); `weights` their probabilities, renormalized to
    sum to 1 when `norm_topk` is set (Qwen3, Mixtral).
  }];
  let arguments = (ins F32Tensor2D:$logits, I64Attr:$top_k, UnitAttr:$norm_topk);
  let results = (outs I32Tensor2DAny:$indices, F32Tensor2D:$weights);
  let assemblyFormat = "$logits attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_MoeRouterGradOp : Piper_ComputeOp<"moe_router_grad", [Pure]> {
  let summary = "Gradient of the router weights w.r.t. the logits";
  let description = [{
    The gradient of `piper.moe_router`'s `weights` with respect to its
    `logits`, through the softmax (and the top-k renormalization when
    `norm_topk` is set); `indices` are the forward's and are not
    differentiable.

    ```mlir
    %dl = piper.moe_router_grad %logits, %idx, %dw {top_k = 2 : i64, norm_topk} : (tensor<128x8xf32>, tensor<128x2xi32>, tensor<128x2xf32>) -> tensor<128x8xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2DAny:$indices,
                       F32Tensor2D:$grad, I64Attr:$top_k, UnitAttr:$norm_topk);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$logits `,` $indices `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_MoeDispatchOp : Piper_ComputeOp<"moe_dispatch", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Copies each routed token into its expert's next free slot";
  let description = [{
    Scatters token rows into a slot buffer [E·C, H] (E = `experts`,
    C = `capacity`): assignment (n, j) of expert e = indices[n, j] takes
    e's lowest free slot s, and row e·C + s gets `input[n]`. Assignments
    are visited in row-major order; once an expert has C of them the rest
    are dropped. Unused slots are zero. `docs/kernels.md` states the rule
    that dispatch, combine and their gradients share.

    ```mlir
    %buf = piper.moe_dispatch %x, %idx {experts = 8 : i64, capacity = 32 : i64} : (tensor<128x64xf32>, tensor<128x2xi32>) -> tensor<256x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I32Tensor2DAny:$indices,
                       I64Attr:$experts, I64Attr:$capacity);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $indices attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_MoeDispatchGradOp : Piper_ComputeOp<"moe_dispatch_grad", [Pure]> {
  let summary = "Gradient of dispatch: sums each token's slot gradients";
  let description = [{
    The gradient of `piper.moe_dispatch` with respect to its input:
    row n sums the slot gradients of token n's kept assignments (dropped
    ones contribute nothing).

    ```mlir
    %dx = piper.moe_dispatch_grad %idx, %dbuf {experts = 8 : i64, capacity = 32 : i64} : (tensor<128x2xi32>, tensor<256x64xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins I32Tensor2DAny:$indices, F32Tensor2D:$grad,
                       I64Attr:$experts, I64Attr:$capacity);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$indices `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_MoeCombineOp : Piper_ComputeOp<"moe_combine", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface>]> {
  let summary = "Weighted sum of each token's expert outputs";
  let description = [{
    Gathers expert outputs back to tokens: y[n] = sum over j of
    weights[n, j] * input[slot(n, j)] for the kept assignments of token n,
    in j order (slots as in `piper.moe_dispatch`).

    ```mlir
    %y = piper.moe_combine %ebuf, %idx, %w {experts = 8 : i64, capacity = 32 : i64} : (tensor<256x64xf32>, tensor<128x2xi32>, tensor<128x2xf32>) -> tensor<128x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I32Tensor2DAny:$indices,
                       F32Tensor2D:$weights, I64Attr:$experts, I64Attr:$capacity);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $indices `,` $weights attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_MoeCombineGradOp : Piper_ComputeOp<"moe_combine_grad", [Pure]> {
  let summary = "Gradients of combine w.r.t. the expert outputs and the weights";
  let description = [{
    The gradients of `piper.moe_combine`: `dinput` (per slot, the
    weight times the token's output gradient; zero for unused slots) and
    `dweights` (per assignment, the dot product of the slot's expert output
    with the token's gradient; zero when dropped).

    ```mlir
    %debuf, %dw = piper.moe_combine_grad %ebuf, %idx, %w, %dy {experts = 8 : i64, capacity = 32 : i64} : (tensor<256x64xf32>, tensor<128x2xi32>, tensor<128x2xf32>, tensor<128x64xf32>) -> (tensor<256x64xf32>, tensor<128x2xf32>)
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, I32Tensor2DAny:$indices,
                       F32Tensor2D:$weights, F32Tensor2D:$grad,
                       I64Attr:$experts, I64Attr:$capacity);
  let results = (outs F32Tensor2D:$dinput, F32Tensor2D:$dweights);
  let assemblyFormat = "$input `,` $indices `,` $weights `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_ExpertLinearOp : Piper_ComputeOp<"expert_linear", [Pure,
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["emitWeightGradients"]>]> {
  let summary = "Per-expert dense layer over expert slots: y[e] = x[e] · w[e]";
  let description = [{
    `input` is a slot buffer [E·C, K] (E = `experts`), `weight` is
    [E, K, M]; rows e·C .. (e+1)·C-1 are multiplied by weight[e]. No bias.

    ```mlir
    %h = piper.expert_linear %buf, %w1 {experts = 8 : i64} : (tensor<256x64xf32>, tensor<8x64x512xf32>) -> tensor<256x512xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor3D:$weight, I64Attr:$experts);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $weight attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_ExpertLinearGradInputOp : Piper_ComputeOp<"expert_linear_grad_input", [Pure]> {
  let summary = "Input gradient of expert_linear";
  let description = [{
    dx = dy · weight[e]ᵀ for the rows of expert e.

    ```mlir
    %dbuf = piper.expert_linear_grad_input %dh, %w1 {experts = 8 : i64} : (tensor<256x512xf32>, tensor<8x64x512xf32>) -> tensor<256x64xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$grad, F32Tensor3D:$weight, I64Attr:$experts);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$grad `,` $weight attr-dict `:` functional-type(operands, results)";
}

def Piper_ExpertLinearGradWeightOp : Piper_ComputeOp<"expert_linear_grad_weight", [Pure]> {
  let summary = "Weight gradient of expert_linear";
  let description = [{
    dweight[e] = x_eᵀ · dy_e over the rows of expert e: the BW half.

    ```mlir
    %dw1 = piper.expert_linear_grad_weight %buf, %dh {experts = 8 : i64} : (tensor<256x64xf32>, tensor<256x512xf32>) -> tensor<8x64x512xf32>
    ```
  }];
  let arguments = (ins F32Tensor2D:$input, F32Tensor2D:$grad, I64Attr:$experts);
  let results = (outs F32Tensor3D:$result);
  let assemblyFormat = "$input `,` $grad attr-dict `:` functional-type(operands, results)";
}

def Piper_MoeAuxLossOp : Piper_ComputeOp<"moe_aux_loss", [
    DeclareOpInterfaceMethods<Piper_DifferentiableOpInterface, ["isLoss"]>]> {
  let summary = "Switch-style load-balancing loss, a term of the training loss";
  let description = [{
    E * sum_e f_e * P_e with f_e the fraction of routing choices that picked
    expert e (before capacity dropping) and P_e the mean router probability
    of e. It is added to the training loss with weight `coeff`; it is not
    Pure because it feeds the loss without being returned.
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2DAny:$indices,
                       I64Attr:$experts, I64Attr:$top_k, F64Attr:$coeff);
  let results = (outs F32Scalar:$loss);
  let assemblyFormat = "$logits `,` $indices attr-dict `:` functional-type(operands, results)";
}

def Piper_MoeAuxLossGradOp : Piper_ComputeOp<"moe_aux_loss_grad", [Pure]> {
  let summary = "Gradient of the weighted load-balancing loss w.r.t. the router logits";
  let description = [{
    The gradient of `coeff` times the loss, times the microbatch's loss seed
    (filled in by the runtime, as for cross_entropy_grad).
  }];
  let arguments = (ins F32Tensor2D:$logits, I32Tensor2DAny:$indices,
                       I64Attr:$experts, I64Attr:$top_k, F64Attr:$coeff);
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$logits `,` $indices attr-dict `:` functional-type(operands, results)";
}

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

//===----------------------------------------------------------------------===//
// The program: the global training DAG.
//===----------------------------------------------------------------------===//

def Piper_ProgramOp : Piper_Op<"program", [Symbol, SingleBlock, NoTerminator,
                                           IsolatedFromAbove]> {
  let summary = "The global training DAG of one step";
  let description = [{
    A single block of program nodes (`piper.batch`, `piper.task`,
    `piper.transfer`, `piper.all_reduce`). The block order is one topological
    order; the DAG's edges are the SSA data edges plus `!piper.token` edges.
    `num_microbatches` and `num_replicas` are set by `split` and `replicate`.

    ```mlir
    piper.program @train {
      %tok, %tgt, %t0 = piper.batch {tag = #piper.tag<MB = 0>} : tensor<4x32xi32>, tensor<4x32xi32>
      %x, %t1 = piper.task @stage0_F(%tok) {tag = #piper.tag<PP = 0, PASS = F>} : (tensor<4x32xi32>) -> (tensor<128x64xf32>, !piper.token)
    }
    ```
  }];
  let arguments = (ins SymbolNameAttr:$sym_name,
                       DefaultValuedAttr<I64Attr, "1">:$num_microbatches,
                       DefaultValuedAttr<I64Attr, "1">:$num_replicas,
                       OptionalAttr<DictionaryAttr>:$optimizer,
                       UnitAttr:$replicated);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins "::llvm::StringRef":$name)>];
}

def Piper_DeviceProgramOp : Piper_Op<"device_program", [Symbol, SingleBlock,
    NoTerminator, IsolatedFromAbove]> {
  let summary = "The program of one device class, in issue order";
  let description = [{
    Produced by `piper-split-devices`: the nodes one device class (all
    data-parallel replicas of a pipeline rank) runs, with transfers lowered to
    `piper.send`/`piper.recv`. After `piper-order-streams` the block order is
    the issue order of every logical stream. `num_microbatches`,
    `num_replicas` and `optimizer` are copied from the program.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, DenseI64ArrayAttr:$ranks,
                       I64Attr:$device_class,
                       DefaultValuedAttr<I64Attr, "1">:$num_microbatches,
                       DefaultValuedAttr<I64Attr, "1">:$num_replicas,
                       OptionalAttr<DictionaryAttr>:$optimizer);
  let regions = (region SizedRegion<1>:$body);
  let assemblyFormat = "$sym_name attr-dict-with-keyword $body";
  let hasVerifier = 1;
  let hasRegionVerifier = 1;
  let skipDefaultBuilders = 1;
  let builders = [OpBuilder<(ins "::llvm::StringRef":$name,
                                 "::llvm::ArrayRef<int64_t>":$ranks,
                                 "int64_t":$deviceClass)>];
}

/// A node of a program or device program (see ProgramNodeOpInterface).
class Piper_NodeOp<string mnemonic, list<Trait> traits = []>
    : Piper_Op<mnemonic, !listconcat(traits, [
        ParentOneOf<["ProgramOp", "DeviceProgramOp"]>,
        Piper_ProgramNodeOpInterface])>;

def Piper_BatchOp : Piper_NodeOp<"batch", [Pure]> {
  let summary = "The tokens and targets of one microbatch";
  let description = [{
    Data input of the DAG. Each device that needs the batch loads it itself
    (data is deterministic per replica and microbatch), so a batch is never
    placed or transferred.
  }];
  let arguments = (ins Piper_TagAttr:$tag);
  let results = (outs I32Tensor2D:$tokens, I32Tensor2D:$targets,
                      Piper_TokenType:$done);
  let assemblyFormat = "attr-dict `:` type($tokens) `,` type($targets)";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return {}; }
    ::mlir::piper::StreamAttr getNodeStream() {
      return ::mlir::piper::StreamAttr::get(getContext(), "compute",
                                            ::mlir::piper::StreamKind::compute);
    }
    ::mlir::MutableOperandRange getNodeDepsMutable() {
      return ::mlir::MutableOperandRange(getOperation(), 0, 0);
    }
  }];
}

def Piper_TaskOp : Piper_NodeOp<"task", [
    DeclareOpInterfaceMethods<SymbolUserOpInterface>, AttrSizedOperandSegments]> {
  let summary = "Runs one segment for one (stage, microbatch, pass)";
  let description = [{
    Tags (`tag`): `PP` stage, `EP` expert region, `MB` microbatch, `PASS` one
    of F, B, BI, BW, U, and `block` (the model region before staging).
    `devices` is the device group that runs it SPMD-style (set by `place`),
    `stream` its logical stream, `send_stream` the stream of the transfers
    `place` inserts on its outgoing data edges. The last result is its
    completion token.

    ```mlir
    %y, %t = piper.task @stage1_F(%x) after(%t0) {devices = #piper.group<2, 3>, stream = #piper.stream<"compute", compute>, tag = #piper.tag<PP = 1, MB = 0, PASS = F>} : (tensor<128x64xf32>) -> (tensor<128x64xf32>, !piper.token)
    ```
  }];
  let arguments = (ins FlatSymbolRefAttr:$segment, Variadic<AnyType>:$args,
                       Variadic<Piper_TokenType>:$deps, Piper_TagAttr:$tag,
                       OptionalAttr<Piper_DeviceGroupAttr>:$devices,
                       OptionalAttr<Piper_StreamAttr>:$stream,
                       OptionalAttr<Piper_StreamAttr>:$send_stream);
  let results = (outs Variadic<AnyType>:$outs, Piper_TokenType:$done);
  let assemblyFormat = [{
    $segment `(` $args `)` (`after` `(` $deps^ `)`)? attr-dict `:`
    functional-type($args, results)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    ::llvm::ArrayRef<int64_t> getNodeDevices() {
      if (auto group = getDevicesAttr())
        return group.getMembers();
      return {};
    }
    /// The task's stream; a task not yet given one runs on "compute".
    ::mlir::piper::StreamAttr getNodeStream();
    ::mlir::MutableOperandRange getNodeDepsMutable() { return getDepsMutable(); }
  }];
}

include "PiperCommOps.td"

#endif // PIPER_OPS_TD
