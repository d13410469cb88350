// Mixture-of-experts compute ops of the piper dialect: routing, dispatch,
// combine, expert GEMMs, the load-balancing loss and their gradients.
// Included by PiperOps.td.
#ifndef PIPER_MOE_OPS_TD
#define PIPER_MOE_OPS_TD

//===----------------------------------------------------------------------===//
// Mixture of experts. Routing picks top_k experts per token; dispatch copies
// each (token, choice) into the next free slot of its expert, up to
// `capacity` slots (later assignments are dropped and contribute nothing);
// experts run batched over [experts * capacity] rows; combine sums the
// weighted expert outputs back per token.
//===----------------------------------------------------------------------===//

def I32Tensor2DAny : ConfinedType<2DTensorOf<[I32]>, [HasStaticShapePred],
                                  "statically shaped 2-D tensor of i32">;
def F32OrI32Tensor2D : ConfinedType<2DTensorOf<[F32, I32]>, [HasStaticShapePred],
                                    "statically shaped 2-D tensor of f32 or i32">;
def I32Tensor1D : ConfinedType<1DTensorOf<[I32]>, [HasStaticShapePred],
                               "statically shaped 1-D tensor of i32">;
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

def Piper_ExpertLinearOp : Piper_Op<"expert_linear", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>,
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

def Piper_ExpertLinearGradInputOp : Piper_Op<"expert_linear_grad_input", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>]> {
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

def Piper_ExpertLinearGradWeightOp : Piper_Op<"expert_linear_grad_weight", [Pure,
    DeclareOpInterfaceMethods<Piper_CostOpInterface, ["getFlops"]>, Piper_WeightGradient]> {
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
// Expert parallelism: layouts around the all-to-alls of an MoE layer whose
// experts are split over the members of an expert-parallel group (inserted
// by `shard` after autodiff; each layout op's gradient is its inverse, which
// the rewrite inserts in the backward itself). docs/kernels.md.
//===----------------------------------------------------------------------===//

def Piper_MoeEpCountsOp : Piper_ComputeOp<"moe_ep_counts", [Pure]> {
  let summary = "Per-expert and per-member row counts of the router's decisions";
  let description = [{
    From the routing `indices` (as `moe_dispatch` keeps an expert's first
    `capacity` assignments): `expert_counts[e]` = the used slots of expert
    e, `send_counts[j]` = the rows member j (owning experts j·L .. j·L+L-1,
    L = experts / members) gets, and `expert_send_counts` = L for every
    member (each member is sent the counts of its own L experts).

    ```mlir
    %send, %ec, %ecs = piper.moe_ep_counts %idx {experts = 8 : i64, capacity = 32 : i64, members = 2 : i64} : (tensor<128x2xi32>) -> (tensor<2xi32>, tensor<8x1xi32>, tensor<2xi32>)
    ```
  }];
  let arguments = (ins I32Tensor2DAny:$indices, I64Attr:$experts,
                       I64Attr:$capacity, I64Attr:$members);
  let results = (outs I32Tensor1D:$send_counts,
                      I32Tensor2DAny:$expert_counts,
                      I32Tensor1D:$expert_send_counts);
  let assemblyFormat = "$indices attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

class Piper_MoeEpLayoutOp<string mnemonic, string what, bit withMembers>
    : Piper_ComputeOp<mnemonic, [Pure, AllTypesMatch<["input", "result"]>]> {
  let summary = what;
  let arguments = !con((ins F32Tensor2D:$input, I32Tensor2DAny:$expert_counts,
                            I64Attr:$experts, I64Attr:$capacity),
                       !if(withMembers, (ins I64Attr:$members), (ins)));
  let results = (outs F32Tensor2D:$result);
  let assemblyFormat = "$input `,` $expert_counts attr-dict `:` functional-type(operands, results)";
  let hasVerifier = 1;
}

def Piper_MoeEpPackOp : Piper_MoeEpLayoutOp<"moe_ep_pack",
    "Packs each expert's used slots consecutively, in expert order", 0> {
  let description = [{
    `input` is a slot buffer [E·C, H]; the first `expert_counts[e]` rows of
    each expert's slots are copied one after the other, so each member's
    experts' rows are consecutive (what an all-to-all sends). Zeros after.
  }];
}

def Piper_MoeEpUnpackOp : Piper_MoeEpLayoutOp<"moe_ep_unpack",
    "Inverse of moe_ep_pack: packed rows back into expert slots", 0> {
  let description = [{ The inverse of `moe_ep_pack` (and its gradient). }];
}

def Piper_MoeEpGatherOp : Piper_MoeEpLayoutOp<"moe_ep_gather",
    "Lays out the rows received from every source as this member's expert slots", 1> {
  let description = [{
    `input` holds the rows received from each member in turn, each source's
    rows grouped by this member's L experts; `expert_counts` ([E, 1],
    source-major: source s, local expert l at s·L + l) says how many. The
    result is L expert slot blocks of capacity members·C: expert l's rows
    from source 0, then source 1, ..., then zeros.
  }];
}

def Piper_MoeEpScatterOp : Piper_MoeEpLayoutOp<"moe_ep_scatter",
    "Inverse of moe_ep_gather: expert slots back into per-source rows", 1> {
  let description = [{ The inverse of `moe_ep_gather` (and its gradient). }];
}

def Piper_EpExchangeOp : Piper_Op<"ep_exchange", [HasParent<"SegmentOp">,
    Piper_SegmentCollectiveOpInterface,
    AllTypesMatch<["input", "result"]>, AllTypesMatch<["send_counts", "recv_counts"]>]> {
  let extraClassDeclaration = Piper_SegmentCollective<"ep", "AllToAll">.decl;
  let summary = "Where the shard rewrite cuts a segment for an all-to-all";
  let description = [{
    The `shard` rewrite (compiler/transforms/ExpertParallel.cpp) leaves it
    around each MoE layer; `piper-lower-segment-collectives` cuts the
    segment before and after it and makes it a `piper.all_to_all` between
    the pieces, over the expert-parallel groups of `members` devices of the
    task's devices (the layout's ep groups), on stream `stream`. Never a
    kernel.

    ```mlir
    %rows, %counts = piper.ep_exchange %packed, %send {members = 2 : i64, stream = "ep_stream"} : tensor<16x8xf32>, tensor<2xi32>
    ```
  }];
  let arguments = (ins F32OrI32Tensor2D:$input, I32Tensor1D:$send_counts,
                       ConfinedAttr<I64Attr, [IntMinValue<2>]>:$members,
                       StrAttr:$stream);
  let results = (outs F32OrI32Tensor2D:$result, I32Tensor1D:$recv_counts);
  let assemblyFormat = "$input `,` $send_counts attr-dict `:` type($input) `,` type($send_counts)";
}

#endif // PIPER_MOE_OPS_TD
