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
      "::mlir::piper::StreamAttr", "getNodeStream">,
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
      "::mlir::piper::DeviceGroupAttr", "getDevices">,
    InterfaceMethod<[{
        The id that matches the copies of a collective spanning several
        device classes, if any.
      }],
      "::std::optional<uint64_t>", "getCollective">,
    InterfaceMethod<[{
        The disjoint, equally sized groups `devices` is split into, each
        running the collective on its own; absent when the whole group runs
        it together.
      }],
      "::mlir::ArrayAttr", "getSubgroupsAttr">,
    InterfaceMethod<[{
        How many ranks run the collective together.
      }],
      "int64_t", "getGroupSize">,
    InterfaceMethod<[{
        Where the collective sits in the step (stage, microbatch).
      }],
      "::mlir::piper::TagAttr", "getTag">,
  ];
}

def Piper_SegmentCollectiveOpInterface
    : OpInterface<"SegmentCollectiveOpInterface"> {
  let cppNamespace = "::mlir::piper";
  let description = [{
    A collective inside a segment, over the groups of one axis of the
    parallel layout (tensor, context or expert parallelism): the marker
    its rewrite leaves where the segment must be cut. One pass for every
    axis, `piper-lower-segment-collectives` (compiler/transforms/
    SegmentCollectives.cpp), cuts the segment around it and makes it a
    program node of its kind over the axis's groups of the task's devices.
  }];
  let methods = [
    InterfaceMethod<[{
        The layout axis whose groups it runs over (tp, cp or ep).
      }],
      "::piper::Axis", "getCollectiveAxis">,
    InterfaceMethod<[{
        The program node it becomes.
      }],
      "::mlir::piper::SegmentCollectiveKind", "getCollectiveKind">,
  ];
}

// The two methods of SegmentCollectiveOpInterface for an op over `axis`
// becoming a `kind` node.
class Piper_SegmentCollective<string axis, string kind> {
  code decl = "::piper::Axis getCollectiveAxis() { return ::piper::Axis::" #
      axis # "; }\n" #
      "::mlir::piper::SegmentCollectiveKind getCollectiveKind() { return " #
      "::mlir::piper::SegmentCollectiveKind::" # kind # "; }";
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

def Piper_DifferentiableOpInterface : OpInterface<"DifferentiableOpInterface"> {
  let cppNamespace = "::mlir::piper";
  let description = [{
    The gradient rule of a forward compute op, next to the op: how
    `piper-build-training-dag` (reverse-mode autodiff) differentiates it.
    The pass walks a segment's ops in reverse; for each op one of whose
    results received a gradient, or that is a loss, it calls
    `emitInputGradients`, then `emitWeightGradients`. A rule reads the
    gradients of the op's results and the forward values it needs through a
    `GradientEmitter` (`dialects/piper/Gradients.h`), builds gradient ops
    with the builder it is handed (into the backward segment) and adds each
    operand's gradient with `GradientEmitter::addGrad`. An op on the
    gradient path without this interface is an error.

    The two halves are the BI and BW work of a zero-bubble schedule. Input
    gradients (of activations) feed the previous op and stage: they are on
    the critical path. Weight gradients (of the operands an op treats as its
    weights: a linear's weight and bias, a norm's gain, an embedding table)
    only end in parameter accumulators and could run later. Today both land
    in one `B` segment, the input half first.

    Rules never accumulate parameters themselves: they add the gradient of a
    weight operand like any other, and the pass turns the gradient of each
    `param_ref` into one `piper.accumulate_grad`.
  }];
  let methods = [
    InterfaceMethod<[{
        Emits the gradients of the op's activation operands (BI work).
      }],
      "::llvm::LogicalResult", "emitInputGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::piper::GradientEmitter &":$emitter)>,
    InterfaceMethod<[{
        Emits the gradients of the op's weight operands (BW work). Ops
        without weights keep the default, which emits nothing.
      }],
      "::llvm::LogicalResult", "emitWeightGradients",
      (ins "::mlir::OpBuilder &":$builder,
           "::mlir::piper::GradientEmitter &":$emitter),
      /*methodBody=*/"",
      /*defaultImplementation=*/[{
        return ::mlir::success();
      }]>,
    InterfaceMethod<[{
        Whether the op computes a term of the training loss. Its gradient is
        then the loss seed, not a gradient received from its users, so the
        pass differentiates it even when no result has a gradient, and a
        scalar result of it that the segment returns is the segment's loss
        (dropped from the forward's results).
      }],
      "bool", "isLoss", (ins), /*methodBody=*/"",
      /*defaultImplementation=*/[{
        return false;
      }]>,
  ];
}

#endif // PIPER_INTERFACES_TD
