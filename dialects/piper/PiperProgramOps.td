// The program level of the piper dialect: programs, device programs and
// their compute nodes (batches, tasks). Communication nodes are in
// PiperCommOps.td. Included by PiperOps.td.
#ifndef PIPER_PROGRAM_OPS_TD
#define PIPER_PROGRAM_OPS_TD

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
                       OptionalAttr<Piper_OptimizerAttr>:$optimizer,
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
                       OptionalAttr<Piper_OptimizerAttr>:$optimizer);
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

#endif // PIPER_PROGRAM_OPS_TD
