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
  // The discardable attributes of segments (and of ops, `recompute`), declared so that passes set and
  // read them through typed helpers (PiperDialect::getPassAttrHelper(), ...)
  // and never by string; verifyOperationAttribute checks their values.
  let discardableAttrs = (ins
    // The model region (transformer block) a segment came from.
    "::mlir::IntegerAttr":$block,
    // The pass a segment runs (#piper.pass<F>, B, BI, BW or U).
    "::mlir::piper::PassKindAttr":$pass,
    // On a forward op: the recompute region (the model block) it belongs
    // to. The backward re-runs the op instead of keeping its results
    // (piper-recompute marks it, autodiff reads and drops it).
    "::mlir::IntegerAttr":$recompute,
    // On the module: the degrees of the axes that split segments' bodies
    // (#piper.mesh: tensor and context parallelism).
    "::mlir::piper::MeshAttr":$mesh,
    // On the module: the stream of tensor parallelism's value all-reduces.
    "::mlir::StringAttr":$tensor_parallel_stream,
    // On the module: the stream of context parallelism's ring exchanges,
    // and whether they wait for the step before them (false; absent: they
    // run beside it).
    "::mlir::StringAttr":$context_parallel_stream,
    "::mlir::BoolAttr":$context_parallel_overlap,
    // On a parameter: sequence parallelism reads it on each member's rows
    // (a norm weight, a row bias), so each member's gradient is a partial
    // sum: replicate sums it over the tensor-parallel group too.
    "::mlir::UnitAttr":$sequence_partial,
    // On a parameter: where it comes from in a Hugging Face checkpoint
    // (an array of #piper.hf_source; docs/hugging-face.md).
    "::mlir::ArrayAttr":$hf_sources,
    // On the module: the Hugging Face config.json it was built from.
    "::mlir::StringAttr":$hf_config
  );
  let hasOperationAttrVerify = 1;
  let extraClassDeclaration = [{
    /// Registers the attributes (PiperAttrs.cpp, next to their storage).
    void registerAttributes();
  }];
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
    /// Whether the tag names a backward pass: fused (B) or either half of a
    /// split one (BI, BW).
    bool isBackward() const {
      return isPass(PassKind::B) || isPass(PassKind::BI) ||
             isPass(PassKind::BW);
    }
    /// This tag with its microbatch set to `mb`.
    TagAttr withMicrobatch(int64_t mb) const;
    /// This tag with its pass set to `kind`.
    TagAttr withPass(PassKind kind) const;
    /// "PP=1 MB=3 PASS=B" for diagnostics and plan labels.
    std::string str() const;
  }];
}

def Piper_TensorSliceAttr : AttrDef<Piper_Dialect, "TensorSlice"> {
  let mnemonic = "tensor_slice";
  let summary = "A parameter's tensor-parallel slice (plan.proto TensorSlice)";
  let description = [{
    Tensor parallelism (`shard_tensor`, docs/tensor-parallel.md) keeps one
    slice of a parameter on each of the `members` devices of a
    tensor-parallel group: dimension `dim` of the global tensor is `members`
    times the parameter's, made of `parts`, consecutive extents (a fused
    q|k|v or gate|up weight; none: one part), and member m holds the m-th of
    `members` equal blocks of each part, in part order.

    ```mlir
    #piper.tensor_slice<dim = 1, members = 2, parts = [64, 32, 32]>
    #piper.tensor_slice<dim = 0, members = 4>
    ```
  }];
  let parameters = (ins "int64_t":$dim, "int64_t":$members,
                        OptionalArrayRefParameter<"int64_t">:$parts);
  let assemblyFormat =
      "`<` `dim` `=` $dim `,` `members` `=` $members (`,` `parts` `=` `[` $parts^ `]`)? `>`";
  let genVerifyDecl = 1;
}

def Piper_HfSourceAttr : AttrDef<Piper_Dialect, "HfSource"> {
  let mnemonic = "hf_source";
  let summary = "A Hugging Face tensor a parameter is made of (plan.proto HfSource)";
  let description = [{
    One tensor of a Hugging Face checkpoint, `name` of `shape`, and where it
    lies in the parameter's global tensor: transposed first when
    `transpose` (a 2-D `nn.Linear` weight, stored [out, in], in a Piper
    weight stored [in, out]), then placed at column `offset` of the last
    dimension, and, when the parameter has one dimension more than the
    placed tensor (a block of experts), at position `index` of its first.
    A parameter's sources cover it exactly (a fused q|k|v weight has three).

    ```mlir
    #piper.hf_source<"model.layers.0.self_attn.k_proj.weight", shape = [32, 64], transpose = true, index = 0, offset = 64>
    ```
  }];
  let parameters = (ins StringRefParameter<>:$name,
                        ArrayRefParameter<"int64_t">:$shape,
                        "::mlir::BoolAttr":$transpose, "int64_t":$index,
                        "int64_t":$offset);
  let assemblyFormat =
      "`<` $name `,` `shape` `=` `[` $shape `]` `,` `transpose` `=` $transpose `,` `index` `=` $index `,` `offset` `=` $offset `>`";
  let genVerifyDecl = 1;
}

def Piper_RopeScalingAttr : AttrDef<Piper_Dialect, "RopeScaling"> {
  let mnemonic = "rope_llama3";
  let summary = "Llama 3.1's rotary frequency scaling (rope_scaling type llama3)";
  let description = [{
    The frequencies theta^(-2i/hd) of rotary embeddings, rescaled as Llama
    3.1 does (`transformers`' `rope_type = "llama3"`): with wavelength
    w = 2 pi / f, L = original_max_position, a frequency with
    w < L / high_freq_factor stays, one with w > L / low_freq_factor is
    divided by `factor`, and one between is interpolated:
    (1 - s) f / factor + s f with s = (L / w - low_freq_factor) /
    (high_freq_factor - low_freq_factor).

    ```mlir
    #piper.rope_llama3<factor = 8.0, low_freq_factor = 1.0, high_freq_factor = 4.0, original_max_position = 8192>
    ```
  }];
  let parameters = (ins APFloatParameter<"">:$factor,
                        APFloatParameter<"">:$low_freq_factor,
                        APFloatParameter<"">:$high_freq_factor,
                        "int64_t":$original_max_position);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
}

def Piper_StreamKind : I32EnumAttr<"StreamKind", "what a logical stream runs", [
  I32EnumAttrCase<"compute", 0>,
  I32EnumAttrCase<"comm", 1>
]> {
  let cppNamespace = "::mlir::piper";
  let genSpecializedAttr = 0;
  let description = [{
    `compute` streams run tasks (kernels), and may also run communication
    serialized with them; `comm` streams run only communication (transfers,
    send/recv, collectives), overlapping the compute streams.
  }];
}

def Piper_StreamAttr : AttrDef<Piper_Dialect, "Stream"> {
  let mnemonic = "stream";
  let summary = "A logical stream: its name and its kind";
  let description = [{
    A program node is issued on one logical stream of each device that runs
    it. Nodes of one stream run in the stream's issue order; different
    streams of a device overlap, synchronized only by token edges. A backend
    maps each logical stream to a queue (a worker thread on CPU, a CUDA
    stream on GPU). Within a program, one name has one kind: tasks need a
    `compute` stream; communication runs on `comm` streams, or on a
    `compute` stream where a strategy asks to serialize it with compute.

    ```mlir
    #piper.stream<"compute", compute>
    #piper.stream<"pp_stream", comm>
    ```
  }];
  let parameters = (ins StringRefParameter<"the stream's name">:$name,
                        EnumParameter<Piper_StreamKind>:$kind);
  let assemblyFormat = "`<` $name `,` $kind `>`";
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    bool isCompute() const { return getKind() == StreamKind::compute; }
    /// "'pp_stream' (comm)" for diagnostics.
    std::string str() const;
  }];
}

def Piper_DeviceGroupAttr : AttrDef<Piper_Dialect, "DeviceGroup"> {
  let mnemonic = "group";
  let summary = "A group of devices (world ranks) that runs a node together";
  let description = [{
    The ranks of a device group, at least one, each non-negative and none
    twice. Order matters where members pair up: member i of a transfer's
    `from` group sends to member i of its `to` group. Collectives require
    increasing members.

    ```mlir
    #piper.group<0, 1, 2, 3>
    ```
  }];
  let parameters = (ins ArrayRefParameter<"int64_t", "ranks">:$members);
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    size_t size() const { return getMembers().size(); }
    operator ::llvm::ArrayRef<int64_t>() const { return getMembers(); }
    const int64_t *begin() const { return getMembers().begin(); }
    const int64_t *end() const { return getMembers().end(); }
    int64_t operator[](size_t i) const { return getMembers()[i]; }
    bool contains(int64_t rank) const {
      return ::llvm::is_contained(getMembers(), rank);
    }
    /// Position of `rank` in the group, or -1.
    int64_t indexOf(int64_t rank) const;
  }];
}

//===----------------------------------------------------------------------===//
// Step-level training settings.
//===----------------------------------------------------------------------===//

def Piper_ComputeType : I32EnumAttr<"ComputeType",
    "the element type a step computes in", [
  I32EnumAttrCase<"f32", 0>,
  I32EnumAttrCase<"bf16", 1>
]> {
  let cppNamespace = "::mlir::piper";
  let genSpecializedAttr = 0;
}

// A double-precision setting (0 unless given): an APFloat, which the
// attribute storage can hash, parsed by FieldParser<APFloat> (PiperDialect.h).
def Piper_F64Parameter : AttrOrTypeParameter<"::llvm::APFloat", ""> {
  let comparator = "$_lhs.bitwiseIsEqual($_rhs)";
  let defaultValue = "::llvm::APFloat(0.0)";
}

def Piper_MeshAttr : AttrDef<Piper_Dialect, "Mesh"> {
  let mnemonic = "mesh";
  let summary = "The module's parallel layout: the degrees that split segments";
  let description = [{
    On the module (`piper.mesh`): the degrees of the axes that split the
    bodies of segments, tensor parallelism (`tp`, set by `shard_tensor`) and
    context parallelism (`cp`, set by `context_parallel`), each 1 when
    omitted. The devices of a stage are dp x cp x tp ranks of Piper's one
    parallel layout (support/ParallelLayout.h: tp innermost, then cp, then
    dp, which is what the stage's device count leaves); `layout(devices)`
    gives it, and every pass that forms groups of a stage's devices asks
    it. Pipeline stages and expert groups come from the program's
    directives (place, shard), data replicas from replicate.

    ```mlir
    module attributes {piper.mesh = #piper.mesh<tp = 2, cp = 4>} { ... }
    ```
  }];
  let parameters = (ins "int64_t":$tp, "int64_t":$cp);
  // `<tp = 2>`, `<cp = 4>`, `<tp = 2, cp = 4>`: an omitted degree is 1, and
  // a degree of 1 is printed only when both are.
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// The layout of a stage on `devices` ranks (dp = devices / (cp x tp),
    /// at least 1) with expert groups of `ep`.
    ::piper::ParallelLayout layout(int64_t devices, int64_t ep = 1) const;
    /// The layout of a stage on `devices` ranks for the groups of its
    /// gradient replicas (dp-cp, ep, edp) and tp: those depend on dp x cp
    /// only, so cp is folded into dp (devices / tp replicas). Exact before
    /// the devices are known to be whole cp x tp blocks.
    ::piper::ParallelLayout replicaLayout(int64_t devices,
                                          int64_t ep = 1) const;
  }];
}

def Piper_OptimizerAttr : AttrDef<Piper_Dialect, "Optimizer"> {
  let mnemonic = "optimizer";
  let summary = "The step-level training settings the runtime applies";
  let description = [{
    The learning-rate schedule (`min_lr`, `warmup_steps`, `decay_steps`),
    gradient clipping by global norm (`clip_grad_norm`, 0 = off) and the
    compute type (`f32`, or `bf16` with fp32 master weights). Each is
    optional and defaults to 0 / `f32`, the plan's own defaults. Set by
    `piper-build-training-dag`, copied to each device program by
    `piper-split-devices`, written to the plans' `training` settings.

    ```mlir
    #piper.optimizer<min_lr = 1.0e-05, warmup_steps = 10, clip_grad_norm = 0.5, dtype = bf16>
    ```
  }];
  let parameters = (ins
    Piper_F64Parameter:$min_lr,
    DefaultValuedParameter<"int64_t", "0">:$warmup_steps,
    DefaultValuedParameter<"int64_t", "0">:$decay_steps,
    Piper_F64Parameter:$clip_grad_norm,
    DefaultValuedParameter<"ComputeType", "ComputeType::f32">:$dtype
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
  let builders = [
    AttrBuilder<(ins "double":$minLr, "int64_t":$warmupSteps,
                     "int64_t":$decaySteps, "double":$clipGradNorm,
                     "ComputeType":$dtype), [{
      return $_get($_ctxt, ::llvm::APFloat(minLr), warmupSteps, decaySteps,
                   ::llvm::APFloat(clipGradNorm), dtype);
    }]>
  ];
}

#endif // PIPER_DIALECT_TD
