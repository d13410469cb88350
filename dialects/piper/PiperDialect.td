// The piper dialect: segments of op-level compute and the global training DAG.
#ifndef PIPER_DIALECT_TD
#define PIPER_DIALECT_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"

def Piper_Dialect : Dialect {
  let name = "piper";
  let summary = "Distributed training programs: segments, tasks and communication";
  let description = [{
    The piper dialect has two levels. *Segments* (`piper.segment`) are
    function-like, isolated-from-above bodies of tensor ops (linear, layer
    norm, attention, cross entropy, their gradients and optimizer updates).
    The *program* (`piper.program`) is the global training DAG: `piper.task`
    runs one segment for one (stage, microbatch, pass); communication nodes
    (`piper.transfer`, `piper.all_reduce`, and after per-device splitting
    `piper.send`/`piper.recv`) move data; `!piper.token` values are
    ordering-only edges. Directives are passes that rewrite the program.
  }];
  let cppNamespace = "::mlir::piper";
  let useDefaultTypePrinterParser = 1;
  let useDefaultAttributePrinterParser = 1;
}

def Piper_TokenType : TypeDef<Piper_Dialect, "Token"> {
  let mnemonic = "token";
  let summary = "An ordering-only edge of the training DAG";
  let description = [{
    A `!piper.token` carries no data: an op taking a token runs after the op
    that produced it. Every node of the program produces one.
  }];
}

def Piper_InitKind : I32EnumAttr<"InitKind", "parameter initializer", [
  I32EnumAttrCase<"zeros", 0>,
  I32EnumAttrCase<"ones", 1>,
  I32EnumAttrCase<"normal", 2>
]> {
  let cppNamespace = "::mlir::piper";
  let genSpecializedAttr = 0;
}

def Piper_InitKindAttr : EnumAttr<Piper_Dialect, Piper_InitKind, "init"> {
  let assemblyFormat = "$value";
}

#endif // PIPER_DIALECT_TD
