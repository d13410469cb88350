// Op interfaces of the piper dialect.
#ifndef PIPER_INTERFACES_TD
#define PIPER_INTERFACES_TD

include "mlir/IR/OpBase.td"

def Piper_ProgramNodeOpInterface : OpInterface<"ProgramNodeOpInterface"> {
  let cppNamespace = "::mlir::piper";
  let description = [{
    A node of the training DAG (`piper.program`) or of a device program: it
    runs on a device group, is issued on a logical stream, runs after its
    `!piper.token` dependencies and produces a completion token. Passes
    that place, split, order and lower programs see every node through this
    interface, so a new kind of node (a collective, a new transfer) is an
    op that implements it, not a case in each pass.
  }];
  let methods = [
    InterfaceMethod<[{
        The devices that run this node; empty when the node is not placed
        yet, or runs wherever it is needed (a batch), or between two groups
        (a transfer).
      }],
      "::llvm::ArrayRef<int64_t>", "getNodeDevices">,
    InterfaceMethod<[{
        The logical stream that issues this node ("compute" by default).
      }],
      "::llvm::StringRef", "getNodeStream">,
    InterfaceMethod<[{
        The ordering-only dependencies of this node.
      }],
      "::mlir::MutableOperandRange", "getNodeDepsMutable">,
    InterfaceMethod<[{
        The completion token of this node.
      }],
      "::mlir::Value", "getNodeDone", (ins), [{
        return $_op.getDone();
      }]>,
  ];
}

def Piper_CollectiveOpInterface : OpInterface<"CollectiveOpInterface"> {
  let cppNamespace = "::mlir::piper";
  let description = [{
    A communication over a device group in which every member takes part
    (all-reduce, reduce-scatter, all-gather, all-to-all). Members issue the
    collectives of a group and stream in the same order; a collective whose
    group spans several device classes carries a `collective` id shared by
    its copies in every class.
  }];
  let methods = [
    InterfaceMethod<[{
        The device group; every member takes part.
      }],
      "::llvm::ArrayRef<int64_t>", "getDevices">,
    InterfaceMethod<[{
        The id that matches the copies of a collective spanning several
        device classes, if any.
      }],
      "::std::optional<uint64_t>", "getCollective">,
    InterfaceMethod<[{
        Where the collective sits in the step (stage, microbatch).
      }],
      "::mlir::piper::TagAttr", "getTag">,
  ];
}

def Piper_CostOpInterface : OpInterface<"CostOpInterface"> {
  let cppNamespace = "::mlir::piper";
  let description = [{
    The cost of one execution of a segment op: floating-point operations and
    bytes moved. `stage` balances pipeline stages by the FLOPs of their
    segments; a simulator can turn both into time with a machine
    description. The defaults count one operation per result element and
    every tensor operand and result once; ops whose work is not linear in
    their output (matrix products, attention) override `getFlops`.
  }];
  let methods = [
    InterfaceMethod<[{
        Floating-point operations of one execution.
      }],
      "double", "getFlops", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        return ::mlir::piper::countResultElements($_op.getOperation());
      }]>,
    InterfaceMethod<[{
        Bytes read and written by one execution.
      }],
      "double", "getBytesMoved", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        return ::mlir::piper::countTensorBytes($_op.getOperation());
      }]>,
  ];
}

#endif // PIPER_INTERFACES_TD
