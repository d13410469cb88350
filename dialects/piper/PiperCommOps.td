// Communication nodes of the piper dialect: transfers and point-to-point
// send/recv between device groups, and value-level collectives over a device
// group. Included by PiperOps.td.
#ifndef PIPER_COMM_OPS_TD
#define PIPER_COMM_OPS_TD

/// Tensors that communication moves: statically shaped f32 (activations,
/// gradients) or i32 (token ids, routing decisions), of rank 1 or more.
def Piper_CommTensor : ConfinedType<RankedTensorOf<[F32, I32]>,
    [HasStaticShapePred, CPred<"::llvm::cast<::mlir::ShapedType>($_self).getRank() >= 1">],
    "statically shaped tensor of f32 or i32 with rank >= 1">;

/// Per-member row counts of an all-to-all: one i32 per member of the group.
def Piper_CountsTensor : ConfinedType<1DTensorOf<[I32]>, [HasStaticShapePred],
    "statically shaped 1-D tensor of i32">;

//===----------------------------------------------------------------------===//
// Point to point
//===----------------------------------------------------------------------===//

/// A point-to-point communication node: ordered by `deps`, issued on the
/// logical `stream`, completed by its `done` token.
class Piper_CommOp<string mnemonic, list<Trait> traits = []>
    : Piper_Op<mnemonic, !listconcat(traits, [Piper_ProgramNodeOpInterface])> {
  code commonDecls = [{
    ::mlir::piper::StreamAttr getNodeStream() { return getStream(); }
    ::mlir::MutableOperandRange getNodeDepsMutable() { return getDepsMutable(); }
  }];
}

def Piper_TransferOp : Piper_CommOp<"transfer", [HasParent<"ProgramOp">,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "Moves a tensor from one device group to another";
  let description = [{
    Inserted by `place` on every data edge that crosses device groups. Member
    i of `from` sends to member i of `to`. Lowered to `piper.send` and
    `piper.recv` by per-device splitting.

    ```mlir
    %y, %t = piper.transfer %x after(%t0) {from = #piper.group<0, 1>, to = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins AnyStaticShapeTensor:$input, Variadic<Piper_TokenType>:$deps,
                       Piper_DeviceGroupAttr:$from, Piper_DeviceGroupAttr:$to,
                       Piper_StreamAttr:$stream);
  let results = (outs AnyStaticShapeTensor:$result, Piper_TokenType:$done);
  let assemblyFormat = [{
    $input (`after` `(` $deps^ `)`)? attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = commonDecls # [{
    /// A transfer runs between two groups: it has no single device group.
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return {}; }
  }];
}

def Piper_RingShiftOp : Piper_CommOp<"ring_shift", [HasParent<"ProgramOp">,
    AllTypesMatch<["input", "result"]>]> {
  let summary = "Passes a tensor one way around rings of devices";
  let description = [{
    Context parallelism's key/value exchange (docs/context-parallel.md).
    `rings` split `devices` (one device class) into rings of equal size,
    each listed in ring order; member k of a ring sends `input` to member
    (k + offset) mod size of its ring and gets `result` from member
    (k - offset) mod size. `tag` places it in the step. Lowered to a
    `piper.send` and a `piper.recv` of one channel in the class's program
    by per-device splitting.

    ```mlir
    %y, %t = piper.ring_shift %x after(%t0) {devices = #piper.group<0, 1>, offset = 1 : i64, rings = [#piper.group<0, 1>], stream = #piper.stream<"cp_stream", comm>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>} : tensor<64x128xf32>
    ```
  }];
  let arguments = (ins Piper_CommTensor:$input, Variadic<Piper_TokenType>:$deps,
                       Piper_DeviceGroupAttr:$devices,
                       TypedArrayAttrBase<Piper_DeviceGroupAttr,
                           "device groups">:$rings,
                       Piper_SignedI64Attr:$offset, Piper_StreamAttr:$stream,
                       Piper_TagAttr:$tag);
  let results = (outs Piper_CommTensor:$result, Piper_TokenType:$done);
  let assemblyFormat = [{
    $input (`after` `(` $deps^ `)`)? attr-dict `:` type($input)
  }];
  let hasVerifier = 1;
  let extraClassDeclaration = commonDecls # [{
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return getDevices().getMembers(); }
    /// Where each member of `devices` (in its order) sends: its ring
    /// member `offset` ahead; with `offset` negated, where it receives
    /// from.
    ::llvm::SmallVector<int64_t> peersAt(int64_t offset);
  }];
}

def Piper_SendOp : Piper_CommOp<"send", [HasParent<"DeviceProgramOp">]> {
  let summary = "Sends a tensor to the same-index member of another class";
  let description = [{
    Replica i of this device class sends `input` to `peers[i]`, which runs
    the `piper.recv` of the same `channel`. Sends are asynchronous: the
    sender goes on at once and its buffer stays alive until the step ends.

    ```mlir
    %t = piper.send %x after(%t0) {channel = 3 : i64, peers = #piper.group<2, 3>, stream = #piper.stream<"pp_stream", comm>} : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins AnyRankedTensor:$input, Variadic<Piper_TokenType>:$deps,
                       Piper_DeviceGroupAttr:$peers, I64Attr:$channel,
                       Piper_StreamAttr:$stream);
  let results = (outs Piper_TokenType:$done);
  let assemblyFormat = "$input (`after` `(` $deps^ `)`)? attr-dict `:` type($input)";
  let extraClassDeclaration = commonDecls # [{
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return {}; }
  }];
}

def Piper_RecvOp : Piper_CommOp<"recv", [HasParent<"DeviceProgramOp">]> {
  let summary = "Receives a tensor from the same-index member of another class";
  let description = [{
    Replica i of this device class receives from `peers[i]` the tensor of
    the `piper.send` with the same `channel`. The receive completes when the
    data has arrived.

    ```mlir
    %y, %t = piper.recv {channel = 3 : i64, peers = #piper.group<0, 1>, stream = #piper.stream<"pp_stream", comm>} : tensor<128x64xf32>
    ```
  }];
  let arguments = (ins Variadic<Piper_TokenType>:$deps,
                       Piper_DeviceGroupAttr:$peers, I64Attr:$channel,
                       Piper_StreamAttr:$stream);
  let results = (outs AnyRankedTensor:$result, Piper_TokenType:$done);
  let assemblyFormat = "(`after` `(` $deps^ `)`)? attr-dict `:` type($result)";
  let extraClassDeclaration = commonDecls # [{
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return {}; }
  }];
}

//===----------------------------------------------------------------------===//
// Collectives
//===----------------------------------------------------------------------===//

/// A collective over the device group `devices`, issued on `stream`.
/// Every member of the group runs it; members issue the collectives of one
/// (group, stream) in the same order. `tag` places it in the step (stage,
/// microbatch); `collective` matches the copies of a collective that spans
/// several device classes. `subgroups` splits `devices` into disjoint groups
/// of equal size, each running the collective on its own (the
/// expert-parallel groups of a data-parallel class, or the ranks holding the
/// same experts); "member" and "group size" then refer to the subgroup.
/// Reductions sum, in rank order, so every member gets the same bits.
class Piper_CollectiveOp<string mnemonic, list<Trait> traits = []>
    : Piper_NodeOp<mnemonic, !listconcat(traits, [Piper_CollectiveOpInterface])> {
  dag commonArgs = (ins Variadic<Piper_TokenType>:$deps,
                        Piper_DeviceGroupAttr:$devices, Piper_StreamAttr:$stream,
                        Piper_TagAttr:$tag, OptionalAttr<I64Attr>:$collective,
                        OptionalAttr<TypedArrayAttrBase<Piper_DeviceGroupAttr,
                            "device groups">>:$subgroups);
  code commonDecls = [{
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return getDevices().getMembers(); }
    ::mlir::piper::StreamAttr getNodeStream() { return getStream(); }
    ::mlir::MutableOperandRange getNodeDepsMutable() { return getDepsMutable(); }
    /// The number of members that run the collective together: the
    /// group's, or one subgroup's.
    int64_t getGroupSize() {
      if (::mlir::ArrayAttr sub = getSubgroupsAttr(); sub && !sub.empty())
        return static_cast<int64_t>(
            ::llvm::cast<::mlir::piper::DeviceGroupAttr>(sub[0]).size());
      return static_cast<int64_t>(getDevices().size());
    }
  }];
  let hasVerifier = 1;
}

def Piper_AllReduceOp : Piper_CollectiveOp<"all_reduce", [
    AttrSizedOperandSegments,
    DeclareOpInterfaceMethods<SymbolUserOpInterface>]> {
  let summary = "Sums tensors, or gradient accumulators, over a device group";
  let description = [{
    Every member contributes its `inputs`; every member gets their sums as
    `results` (same types). In the gradient form (`grads`, no inputs) it
    sums the gradient accumulators of the named parameters in place: this is
    how `replicate` expresses data parallelism, one node per gradient bucket
    after the last backward and before the update. An all-reduce over
    several device classes (a tied parameter, inserted by
    `piper-tie-params`) carries a `collective` id shared by its copies in
    every class.

    ```mlir
    %s, %t = piper.all_reduce %x : tensor<8x64xf32> -> tensor<8x64xf32> after(%t0) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 1>}
    %g = piper.all_reduce grads [@wte, @wpe] after(%t1) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>}
    ```
  }];
  let arguments = !con((ins Variadic<Piper_CommTensor>:$inputs,
                            OptionalAttr<FlatSymbolRefArrayAttr>:$grads),
                       commonArgs);
  let results = (outs Variadic<Piper_CommTensor>:$results, Piper_TokenType:$done);
  let assemblyFormat = [{
    (`grads` $grads^)? ($inputs^ `:` type($inputs) `->` type($results))?
    (`after` `(` $deps^ `)`)? attr-dict
  }];
  let builders = [
    // The gradient form.
    OpBuilder<(ins "::mlir::ArrayAttr":$grads, "::mlir::ValueRange":$deps,
                   "DeviceGroupAttr":$devices,
                   "StreamAttr":$stream, "TagAttr":$tag,
                   "::mlir::IntegerAttr":$collective)>,
    // The value form: results have the types of the inputs.
    OpBuilder<(ins "::mlir::ValueRange":$inputs, "::mlir::ValueRange":$deps,
                   "DeviceGroupAttr":$devices,
                   "StreamAttr":$stream, "TagAttr":$tag)>,
  ];
  let extraClassDeclaration = commonDecls # [{
    /// The parameters whose gradient accumulators the gradient form sums
    /// (empty for the value form).
    ::llvm::ArrayRef<::mlir::Attribute> getParams() {
      if (auto g = getGrads())
        return g->getValue();
      return {};
    }
  }];
}

def Piper_ReduceScatterOp : Piper_CollectiveOp<"reduce_scatter"> {
  let summary = "Sums a tensor over a device group; each member keeps a slice";
  let description = [{
    Sums `input` over the group and leaves member i the i-th slice of the
    sum along dimension 0. Slices are balanced and exact: with N rows and G
    members, member i holds `N / G` rows, plus one when `i < N % G`, starting
    where member i-1's slice ends. `result` has the largest slice's rows
    (`ceil(N / G)`); a member with a shorter slice gets zeros after it. f32
    only.

    ```mlir
    %s, %t = piper.reduce_scatter %g after(%t0) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<10x64xf32> -> tensor<4x64xf32>
    ```
  }];
  let arguments = !con((ins Piper_CommTensor:$input), commonArgs);
  let results = (outs Piper_CommTensor:$result, Piper_TokenType:$done);
  let assemblyFormat = [{
    $input (`after` `(` $deps^ `)`)? attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = commonDecls;
}

def Piper_AllGatherOp : Piper_CollectiveOp<"all_gather"> {
  let summary = "Concatenates the slices of every member along dimension 0";
  let description = [{
    The inverse of `piper.reduce_scatter`'s slicing: member i contributes
    the first rows of `input` that its balanced slice of `result` holds
    (`N / G` rows, plus one when `i < N % G`, for N result rows and G
    members), and every member gets the whole `result`. `input` has
    `ceil(N / G)` rows.

    ```mlir
    %w, %t = piper.all_gather %shard after(%t0) {devices = #piper.group<0, 1, 2>, stream = #piper.stream<"gather_stream", comm>, tag = #piper.tag<PP = 0>} : tensor<4x64xf32> -> tensor<10x64xf32>
    ```
  }];
  let arguments = !con((ins Piper_CommTensor:$input), commonArgs);
  let results = (outs Piper_CommTensor:$result, Piper_TokenType:$done);
  let assemblyFormat = [{
    $input (`after` `(` $deps^ `)`)? attr-dict `:` type($input) `->` type($result)
  }];
  let extraClassDeclaration = commonDecls;
}

def Piper_AllToAllOp : Piper_CollectiveOp<"all_to_all"> {
  let summary = "Exchanges rows between the members of a group, counts decided at run time";
  let description = [{
    `input`'s rows are grouped by destination: the first `send_counts[0]`
    rows go to member 0, the next `send_counts[1]` to member 1, and so on.
    Member i's `result` holds the rows received from member 0, then from
    member 1, ...; `recv_counts[j]` is how many came from member j. Counts
    are values computed by the program (e.g. an MoE router's decisions),
    known only at run time; `result`'s static row count is a capacity. Rows
    after the received ones are zero. Sending more rows than `input` has,
    or receiving more than `result` holds, is a run-time error naming the
    members.

    ```mlir
    %y, %rc, %t = piper.all_to_all %x, %sc after(%t0) {devices = #piper.group<0, 1>, stream = #piper.stream<"ep_stream", comm>, tag = #piper.tag<PP = 0, MB = 0>} : tensor<16x64xf32>, tensor<2xi32> -> tensor<32x64xf32>, tensor<2xi32>
    ```
  }];
  let arguments = !con((ins Piper_CommTensor:$input, Piper_CountsTensor:$send_counts),
                       commonArgs);
  let results = (outs Piper_CommTensor:$result, Piper_CountsTensor:$recv_counts,
                      Piper_TokenType:$done);
  let assemblyFormat = [{
    $input `,` $send_counts (`after` `(` $deps^ `)`)? attr-dict `:`
    type($input) `,` type($send_counts) `->` type($result) `,` type($recv_counts)
  }];
  let extraClassDeclaration = commonDecls;
}

//===----------------------------------------------------------------------===//
// ZeRO: collectives on sharded parameter state
//===----------------------------------------------------------------------===//

/// A collective on the state of ZeRO-sharded parameters: `params` are
/// sharded over `devices` (the stage's data-parallel group, in increasing
/// rank order), each flattened and split into balanced consecutive ranges,
/// member i holding N / G elements plus one when i < N % G. `zero` is the
/// ZeRO stage (1: AdamW moments sharded; 2: and gradient accumulators; 3:
/// and the fp32 parameters); every ZeRO collective naming a parameter gives
/// the same stage.
class Piper_ZeroCollectiveOp<string mnemonic, list<Trait> traits = []>
    : Piper_CollectiveOp<mnemonic, !listconcat(traits, [
        DeclareOpInterfaceMethods<SymbolUserOpInterface>])> {
  code zeroDecls = [{
    ::llvm::ArrayRef<::mlir::Attribute> getParamRefs() {
      return getParams().getValue();
    }
  }];
}

def Piper_ReduceScatterGradsOp : Piper_ZeroCollectiveOp<"reduce_scatter_grads", [
    AttrSizedOperandSegments]> {
  let summary = "Sums gradients over a data-parallel group; each member keeps its ZeRO range";
  let description = [{
    Without `inputs`, sums the gradient accumulators of `params` (whole
    tensors, ZeRO-1) and leaves each member its range of the sums. With
    `inputs` (one whole gradient per parameter, of one microbatch: ZeRO-2
    and 3 reduce each microbatch's gradients as they are produced), each
    member adds its range of the sums into its sharded accumulators.

    ```mlir
    %t = piper.reduce_scatter_grads [@wte, @wpe] after(%t0) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>, zero = 1 : i64}
    %t2 = piper.reduce_scatter_grads [@wte] %g : tensor<32x16xf32> after(%t1) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0, MB = 0>, zero = 2 : i64}
    ```
  }];
  let arguments = !con((ins Variadic<Piper_CommTensor>:$inputs,
                            FlatSymbolRefArrayAttr:$params, I64Attr:$zero),
                       commonArgs);
  let results = (outs Piper_TokenType:$done);
  let assemblyFormat = [{
    $params ($inputs^ `:` type($inputs))? (`after` `(` $deps^ `)`)? attr-dict
  }];
  let extraClassDeclaration = commonDecls # zeroDecls;
}

def Piper_AllGatherParamsOp : Piper_ZeroCollectiveOp<"all_gather_params"> {
  let summary = "Rebuilds whole parameters from every member's ZeRO range";
  let description = [{
    Every member contributes its range of each parameter of `params`.
    Without results (ZeRO-1 and 2, after the update), the whole parameters
    are completed in place; with results (ZeRO-3, before each use), the
    gathered parameters are new tensors of the parameters' types, alive
    until their last reader.

    ```mlir
    %t = piper.all_gather_params [@wte, @wpe] after(%t0) {devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>, tag = #piper.tag<PP = 0>, zero = 1 : i64}
    %w, %t2 = piper.all_gather_params [@wte] -> tensor<32x16xf32> {devices = #piper.group<0, 1>, stream = #piper.stream<"gather_stream", comm>, tag = #piper.tag<PP = 0, MB = 0, PASS = F>, zero = 3 : i64}
    ```
  }];
  let arguments = !con((ins FlatSymbolRefArrayAttr:$params, I64Attr:$zero),
                       commonArgs);
  let results = (outs Variadic<Piper_CommTensor>:$results, Piper_TokenType:$done);
  let assemblyFormat = [{
    $params (`->` type($results)^)? (`after` `(` $deps^ `)`)? attr-dict
  }];
  let extraClassDeclaration = commonDecls # zeroDecls;
}

//===----------------------------------------------------------------------===//
// Gradient clipping
//===----------------------------------------------------------------------===//

def Piper_ClipGradsOp : Piper_Op<"clip_grads", [HasParent<"DeviceProgramOp">,
    Piper_ProgramNodeOpInterface]> {
  let summary = "Global-norm gradient clipping over every device of the strategy";
  let description = [{
    The norm is global: each device class contributes the squared norm of
    its (already data-parallel reduced) gradients, summed over all ranks.
    Every device program has exactly one, after its last gradient
    all-reduce and before its update tasks.

    ```mlir
    %t = piper.clip_grads after(%t0, %t1) {max_norm = 1.000000e+00 : f64}
    ```
  }];
  let arguments = (ins Variadic<Piper_TokenType>:$deps, F64Attr:$max_norm);
  let results = (outs Piper_TokenType:$done);
  let assemblyFormat = "(`after` `(` $deps^ `)`)? attr-dict";
  let extraClassDeclaration = [{
    /// A world collective: every rank takes part.
    ::llvm::ArrayRef<int64_t> getNodeDevices() { return {}; }
    ::mlir::piper::StreamAttr getNodeStream() {
      return ::mlir::piper::StreamAttr::get(getContext(), "compute",
                                            ::mlir::piper::StreamKind::compute);
    }
    ::mlir::MutableOperandRange getNodeDepsMutable() { return getDepsMutable(); }
  }];
}

#endif // PIPER_COMM_OPS_TD
