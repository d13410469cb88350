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
  // Discardable attributes (`piper.block`, `piper.pass` on segments).
  let hasOperationAttrVerify = 1;
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

//===----------------------------------------------------------------------===//
// The vocabulary of the training DAG: passes, tags and streams.
//===----------------------------------------------------------------------===//

def Piper_PassKind : I32EnumAttr<"PassKind", "the pass a program node runs", [
  I32EnumAttrCase<"F", 0>,
  I32EnumAttrCase<"B", 1>,
  I32EnumAttrCase<"BI", 2>,
  I32EnumAttrCase<"BW", 3>,
  I32EnumAttrCase<"U", 4>
]> {
  let cppNamespace = "::mlir::piper";
  let genSpecializedAttr = 0;
  let description = [{
    `F` forward, `B` backward, `BI` and `BW` the input- and weight-gradient
    halves of a split backward (zero-bubble schedules), `U` the optimizer
    update.
  }];
}

def Piper_PassKindAttr : EnumAttr<Piper_Dialect, Piper_PassKind, "pass"> {
  let summary = "The pass of a segment (F, B, BI, BW or U)";
  let assemblyFormat = "`<` $value `>`";
}

def Piper_TagAttr : AttrDef<Piper_Dialect, "Tag"> {
  let mnemonic = "tag";
  let summary = "Where a program node sits in the training step";
  let description = [{
    The coordinates of a program node, each optional: `PP` pipeline stage,
    `EP` expert region, `MB` microbatch, `PASS` (F, B, BI, BW, U) and `block`
    (the model region, before `stage` groups blocks into stages). Indices are
    non-negative. Strategy filters (`{"PP": 0, "PASS": "F"}`) match tags.

    ```mlir
    #piper.tag<PP = 1, MB = 3, PASS = B>
    #piper.tag<block = 0>
    #piper.tag<>
    ```
  }];
  let parameters = (ins
    OptionalParameter<"std::optional<int64_t>">:$pp,
    OptionalParameter<"std::optional<int64_t>">:$ep,
    OptionalParameter<"std::optional<int64_t>">:$mb,
    OptionalParameter<"std::optional<::mlir::piper::PassKind>">:$pass,
    OptionalParameter<"std::optional<int64_t>">:$block);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let builders = [
    AttrBuilder<(ins), [{
      return $_get($_ctxt, std::nullopt, std::nullopt, std::nullopt,
                   std::nullopt, std::nullopt);
    }]>
  ];
  let extraClassDeclaration = [{
    /// Integer coordinate `key` (PP, EP, MB or block), if present.
    std::optional<int64_t> getIndex(::llvm::StringRef key) const;
    /// Whether the tag names pass `kind`.
    bool isPass(PassKind kind) const { return getPass() == kind; }
    /// This tag with its microbatch set to `mb`.
    TagAttr withMicrobatch(int64_t mb) const;
    /// This tag with its pass set to `kind`.
    TagAttr withPass(PassKind kind) const;
    /// "PP=1 MB=3 PASS=B" for diagnostics and plan labels.
    std::string str() const;
  }];
}

#endif // PIPER_DIALECT_TD
