// The piper passes: one per directive and compiler phase.
#ifndef PIPER_COMPILER_TRANSFORMS_PASSES_TD
#define PIPER_COMPILER_TRANSFORMS_PASSES_TD

include "mlir/Pass/PassBase.td"

def PiperStage : Pass<"piper-stage", "::mlir::ModuleOp"> {
  let summary = "Group contiguous model blocks into pipeline stages";
  let description = [{
    The `stage` directive. The forward model's tasks (one per block, tagged
    `block = i`) are partitioned into `stages` contiguous groups minimizing
    the largest estimated FLOP count; each group's segments are merged into
    one segment `@stageN` and one task tagged `PP = N`.
  }];
  let options = [Option<"stages", "stages", "int64_t", "1", "number of stages">];
}

def PiperBuildTrainingDag : Pass<"piper-build-training-dag", "::mlir::ModuleOp"> {
  let summary = "Reverse-mode autodiff, loss and AdamW update tasks";
  let description = [{
    For every stage task, differentiates its segment into a backward segment
    (`@stageN_B`; input and weight gradients as separate ops), makes the
    forward segment (`@stageN_F`) accumulate the loss and return the
    activations the backward needs, and adds an update task per stage
    (`@stageN_U`: AdamW then clearing the gradient accumulators). Tasks get
    `PASS = F | B | U` tags.
  }];
  let options = [
    Option<"lr", "lr", "double", "6e-4", "learning rate">,
    Option<"beta1", "beta1", "double", "0.9", "AdamW beta1">,
    Option<"beta2", "beta2", "double", "0.95", "AdamW beta2">,
    Option<"eps", "eps", "double", "1e-8", "AdamW epsilon">,
    Option<"weightDecay", "weight-decay", "double", "0.1",
           "decoupled weight decay of matrices (vectors get none)">,
    Option<"minLr", "min-lr", "double", "6e-5",
           "learning rate at the end of the cosine decay">,
    Option<"warmupSteps", "warmup-steps", "int64_t", "0",
           "linear learning-rate warmup steps">,
    Option<"decaySteps", "decay-steps", "int64_t", "0",
           "step at which the cosine decay reaches min-lr (0: no decay)">,
    Option<"clipGradNorm", "clip-grad-norm", "double", "1.0",
           "global gradient-norm clipping threshold (0: off)">,
    Option<"dtype", "dtype", "::mlir::piper::ComputeType",
           "::mlir::piper::ComputeType::f32", "compute dtype",
           [{::llvm::cl::values(
             clEnumValN(::mlir::piper::ComputeType::f32, "f32", "fp32"),
             clEnumValN(::mlir::piper::ComputeType::bf16, "bf16",
                        "bf16 mixed precision (fp32 master weights, "
                        "accumulation and optimizer state)"))}]>,
    Option<"noOptimizer", "no-optimizer", "bool", "false",
           "forward and backward only: no update tasks">,
    Option<"fuseClassifier", "fuse-classifier", "bool", "true",
           "compute a returned cross entropy's logits gradient in the "
           "forward, fused with the loss (piper.cross_entropy_fused)">,
    Option<"fuseEpilogues", "fuse-epilogues", "bool", "true",
           "compute a biased linear's weight and bias gradients in one op "
           "(piper.linear_grad_weight_bias: on CUDA, the bias gradient in "
           "the weight gradient's GEMM epilogue)">,
  ];
}

def PiperSplit : Pass<"piper-split", "::mlir::ModuleOp"> {
  let summary = "Copy the training DAG per microbatch (MB tag)";
  let description = [{
    The `split` directive: every batch, forward and backward node is copied
    `microbatches` times with `MB = 0..M-1`; update tasks are not copied and
    depend on every copy of their stage's backward.
  }];
  let options = [Option<"microbatches", "microbatches", "int64_t", "1",
                        "number of microbatches">];
}

def PiperPlace : Pass<"piper-place", "::mlir::ModuleOp"> {
  let summary = "Assign a device group to the tasks of one stage";
  let description = [{
    The `place` directive for the filter `{"PP": pp}`. Once every task is
    placed, inserts a `piper.transfer` on every data edge crossing device
    groups, on `stream`.
  }];
  let options = [
    Option<"pp", "pp", "int64_t", "0", "stage index (filter PP)">,
    ListOption<"devices", "devices", "int64_t", "device group">,
    Option<"stream", "stream", "std::string", "\"pp_stream\"",
           "stream of the transfers">,
  ];
}

def PiperReplicate : Pass<"piper-replicate", "::mlir::ModuleOp"> {
  let summary = "Data parallelism for one stage: bucketed gradient all-reduce";
  let description = [{
    The `replicate` directive for the filter `{"PP": pp}`: the stage's
    tasks must run on `devices`; its gradients are summed over them by
    `piper.all_reduce` nodes of about `bucket-mb` MB each, after the last
    backward and before the update. With `zero`, the stage's state is
    sharded over them instead (`piper.reduce_scatter_grads`,
    `piper.all_gather_params`); the ZeRO-3 gathers get their prefetch
    dependencies only in `piper-apply-strategy`, after the order
    directives.
  }];
  let options = [
    Option<"pp", "pp", "int64_t", "0", "stage index (filter PP)">,
    ListOption<"devices", "devices", "int64_t", "device group">,
    Option<"bucketMb", "bucket-mb", "double", "25", "bucket size in MB">,
    Option<"reduceStream", "reduce-stream", "std::string", "\"dp_stream\"",
           "stream of the all-reduces">,
    Option<"zero", "zero", "int", "0",
           "ZeRO stage: 1 shards the AdamW moments, 2 also the gradients, 3 "
           "also the parameters (docs/zero.md)">,
    Option<"gatherStream", "gather-stream", "std::string", "\"\"",
           "stream of the ZeRO parameter all-gathers (default: reduce-stream)">,
  ];
}

def PiperShard : Pass<"piper-shard", "::mlir::ModuleOp"> {
  let summary = "Expert parallelism for the MoE layers of one stage";
  let description = [{
    The `shard` directive for the filter `{"PP": pp, "EP": "*"}`: every MoE
    layer of the stage's forward and backward tasks (placed on `devices`)
    splits its experts over consecutive groups of `ep` devices, exchanging
    rows with the router's real per-member counts in `piper.all_to_all`s on
    `stream` (docs/expert-parallel.md). Run before `piper-replicate`.
  }];
  let options = [
    Option<"pp", "pp", "int64_t", "0", "stage index (filter PP)">,
    ListOption<"devices", "devices", "int64_t", "the stage's device group">,
    Option<"ep", "ep", "int64_t", "0",
           "expert-parallel degree (0: all of devices)">,
    Option<"stream", "stream", "std::string", "\"ep_stream\"",
           "stream of the all-to-alls">,
  ];
}

def PiperTieParams : Pass<"piper-tie-params", "::mlir::ModuleOp"> {
  let summary = "Sum the gradients of parameters shared by several stages";
  let description = [{
    A parameter used by several pipeline stages (a tied LM head) has a copy,
    an accumulator and an update in each stage. This pass adds one
    `piper.all_reduce` over every device holding a copy (tagged
    a `collective` id so all classes issue it together), after the last
    backward that accumulates it and before every update of it. Run after
    placement and replicate (which leaves shared parameters to it).
  }];
  let options = [
    Option<"bucketMb", "bucket-mb", "double", "25.0",
           "gradient bucket size of the all-reduces in MB (2^20 bytes): "
           "the replicate directives' bucket_size">,
  ];
}

def PiperOrder : Pass<"piper-order", "::mlir::ModuleOp"> {
  let summary = "Apply the order directives of a JSON file";
  let description = [{
    The `order` directive: each directive's filter groups, in order, become
    token edges (`after`) so that the tasks a group matches run after those
    of the group before it on the same device group. `file` is a strategy
    JSON list; its `order` directives are applied in order and any other
    directive is an error (use piper-apply-strategy for whole strategies).
    A cycle with the data edges is an error naming the nodes.
  }];
  let options = [Option<"file", "file", "std::string", "\"\"",
                        "JSON file of order directives">];
}

def PiperSchedule : Pass<"piper-schedule", "::mlir::ModuleOp"> {
  let summary = "Order every stage's tasks by a pipeline schedule";
  let description = [{
    Runs a schedule builder (`gpipe` or `1f1b`) for the program's stages and
    microbatches and applies the `order` directives it emits.
  }];
  let options = [Option<"schedule", "schedule", "std::string", "\"1f1b\"",
                        "gpipe or 1f1b">];
}

def PiperFinalizePlacement : Pass<"piper-finalize-placement", "::mlir::ModuleOp"> {
  let summary = "Check that every task is placed and insert the transfers";
  let description = [{
    Ends the `place` directives: every task must be on a device group (when
    no task is placed at all, all of them go to device 0), and a
    `piper.transfer` goes on every data edge between groups, on the stream
    named by the sender's place (`send_stream`). With `world-size`, device
    indices beyond it are an error.
  }];
  let options = [Option<"worldSize", "world-size", "int64_t", "0",
                        "number of devices (0: unbounded)">];
}

def PiperSplitBackward : Pass<"piper-split-backward", "::mlir::ModuleOp"> {
  let summary = "Split backward tasks into input- and weight-gradient tasks";
  let description = [{
    Replaces every fused backward task (`PASS = B`) of the stages `pp` and
    microbatches `mb` (each: all when empty) by a BI task (the
    activation-gradient chain) and, after it, a BW task (the weight
    gradients and their accumulation), as an `order` directive naming
    `PASS: BI` does before it orders them (zero-bubble schedules).
  }];
  let options = [
    ListOption<"pp", "pp", "int64_t", "stages (default: all)">,
    ListOption<"mb", "mb", "int64_t", "microbatches (default: all)">,
  ];
}

def PiperApplyDirective : Pass<"piper-apply-directive", "::mlir::ModuleOp"> {
  let summary = "Apply one strategy directive";
  let description = [{
    One directive of a strategy, as its JSON object (`split`, `place`,
    `replicate`, `shard`, `order` or `schedule`; see docs/directives.md).
    The directive pipeline (`piper-directives-pipeline`, and piperc) runs
    one of these per directive of the strategy, in phase order, with
    `piper-finalize-placement`, `piper-tie-params` and
    `piper-bound-zero-collectives` between the phases.
  }];
  let options = [
    Option<"directive", "directive", "std::string", "",
           "the directive, a JSON object">,
    Option<"worldSize", "world-size", "int64_t", "0",
           "number of devices (0: unbounded)">,
  ];
}

def PiperRecompute : Pass<"piper-recompute", "::mlir::ModuleOp"> {
  let summary = "The recompute directive: activation recomputation of blocks";
  let description = [{
    On the forward model, before `piper-stage`: marks the forward ops of
    the selected transformer blocks (every block, or `block`) with their
    recompute region; `piper-build-training-dag` then keeps only each
    region's inputs for the backward and re-runs the marked ops there
    (docs/recompute.md). `granularity` `full` recomputes whole blocks,
    `selective` their attention core.
  }];
  let options = [
    Option<"granularity", "granularity", "::mlir::piper::RecomputeGranularity",
           "::mlir::piper::RecomputeGranularity::Full",
           "what of a block the backward recomputes", [{::llvm::cl::values(
             clEnumValN(::mlir::piper::RecomputeGranularity::Full, "full",
                        "every op of the block"),
             clEnumValN(::mlir::piper::RecomputeGranularity::Selective,
                        "selective", "its attention core"))}]>,
    Option<"block", "block", "int64_t", "-1",
           "the model block (-1: every transformer block)">,
  ];
}

def PiperShardTensor : Pass<"piper-shard-tensor", "::mlir::ModuleOp"> {
  let summary = "The shard_tensor directive: tensor (and sequence) parallelism";
  let description = [{
    On the forward model, before `piper-stage`: splits the matrices of the
    selected transformer blocks (every block, or `block`) over groups of
    `tp` devices, Megatron's way (column- then row-parallel, local heads),
    with `piper.tp_copy` / `piper.tp_reduce` at the group's boundaries, and
    records `tp` in the module's `#piper.mesh`;
    `piper-lower-segment-collectives` makes the reductions all-reduces
    after placement (docs/tensor-parallel.md).
  }];
  let options = [
    Option<"tp", "tp", "int64_t", "2", "tensor-parallel degree">,
    Option<"sequenceParallel", "sequence-parallel", "bool", "false",
           "norms, residual adds and biases on each member's rows">,
    Option<"vocabParallel", "vocab-parallel", "bool", "true",
           "the token embedding and LM head split by vocabulary rows">,
    Option<"stream", "stream", "std::string", "\"tp_stream\"",
           "stream of the all-reduces">,
    Option<"block", "block", "int64_t", "-1",
           "the model block (-1: every transformer block)">,
  ];
}

def PiperContextParallel : Pass<"piper-context-parallel", "::mlir::ModuleOp"> {
  let summary = "The context_parallel directive: the sequence split over cp";
  let description = [{
    On the forward model, before `piper-stage`: every microbatch's sequence
    is split over groups of `cp` devices (Megatron's load-balanced chunks),
    every value with a row per token holds its member's rows, and attention
    becomes `piper.cp_attention` (ring attention, or Ulysses' all-to-alls
    with `kind=ulysses`); records `cp` in the module's `#piper.mesh`.
    `piper-lower-context-parallel` makes the exchanges after placement
    (docs/context-parallel.md).
  }];
  let options = [
    Option<"cp", "cp", "int64_t", "2", "context-parallel degree">,
    Option<"kind", "kind", "::mlir::piper::ContextParallelKind",
           "::mlir::piper::ContextParallelKind::Ring",
           "how attention sees the other members' tokens", [{::llvm::cl::values(
             clEnumValN(::mlir::piper::ContextParallelKind::Ring, "ring",
                        "ring attention: key/value shards passed around"),
             clEnumValN(::mlir::piper::ContextParallelKind::Ulysses, "ulysses",
                        "all-to-alls from the sequence to the heads"))}]>,
    Option<"overlap", "overlap", "bool", "true",
           "each ring exchange beside the ring step before it">,
    Option<"stream", "stream", "std::string", "\"cp_stream\"",
           "stream of the exchanges">,
  ];
}

def PiperLowerContextParallel
    : Pass<"piper-lower-context-parallel", "::mlir::ModuleOp"> {
  let summary = "Make context parallelism's rings, all-to-alls and gathers";
  let description = [{
    After placement, on a model that `context_parallel` split (the module's
    `#piper.mesh` cp): each `piper.cp_attention` and
    `piper.cp_attention_grad` becomes its ring of `piper.attention_block`
    and `piper.attention_block_grad` kernels with a `piper.cp_ring_shift`
    between steps; Ulysses' sequence/head exchanges become
    `piper.cp_all_to_all`s and an MoE layer's gathers
    `piper.cp_all_gather`s and `piper.cp_reduce_scatter`s (segment
    collectives, which `piper-lower-segment-collectives` makes program
    nodes). Without `context_parallel`, a stray ring op is an error, and
    otherwise it changes nothing (docs/context-parallel.md).
  }];
}

def PiperLowerSegmentCollectives
    : Pass<"piper-lower-segment-collectives", "::mlir::ModuleOp"> {
  let summary = "Make every in-segment collective (tp, cp, ep) a program node";
  let description = [{
    After placement and the axis rewrites (`shard_tensor`, `shard`,
    `piper-lower-context-parallel`): each task whose segment holds segment
    collectives (SegmentCollectiveOpInterface: `piper.tp_reduce`, the
    sequence-parallel row collectives, the context-parallel exchanges,
    `piper.ep_exchange`) is cut around them, and each becomes the program
    node of its kind (`piper.all_reduce`, `all_gather`, `reduce_scatter`,
    `all_to_all`, `ring_shift`) over its axis's groups of the task's
    devices (the layout's tp, cp or ep groups), on its axis's stream, in
    the task's chain (an overlapped ring exchange beside it).
    `piper.tp_copy` (tensor parallelism's identity forward) is erased.
    Without segment collectives it changes nothing (docs/compiler.md).
  }];
}

def PiperBoundZeroCollectives
    : Pass<"piper-bound-zero-collectives", "::mlir::ModuleOp"> {
  let summary = "Bound the ZeRO-2/3 gradients in flight; set ZeRO-3 prefetch";
  let description = [{
    Runs after the order directives, when the block order is the
    schedule's: a backward piece task waits for the reduce-scatters of the
    piece two before it on its device group and stream, so at most two
    pieces' gradients are in flight; every ZeRO-3 parameter all-gather gets
    its prefetch dependency (docs/zero.md). Without ZeRO-2/3 it changes
    nothing.
  }];
}

def PiperApplyStrategy : Pass<"piper-apply-strategy", "::mlir::ModuleOp"> {
  let summary = "Apply a JSON strategy file to a forward model";
  let description = [{
    Parses the strategy and runs, in phase order: stage, build-training-dag,
    split, place (and transfers), replicate, order. Every error names the
    directive (index and text) and the nodes involved.
  }];
  let options = [
    Option<"file", "file", "std::string", "", "strategy JSON file">,
    Option<"worldSize", "world-size", "int64_t", "0",
           "number of devices (0: the file's world_size, or derived)">,
  ];
}

def PiperSplitDevices : Pass<"piper-split-devices", "::mlir::ModuleOp"> {
  let summary = "Split the program into one device program per device class";
  let description = [{
    Every distinct device group becomes a `piper.device_program`;
    `piper.transfer` becomes a `piper.send` in the sender's class and a
    `piper.recv` in the receiver's, matched by a channel number.
  }];
}

def PiperOrderStreams : Pass<"piper-order-streams", "::mlir::ModuleOp"> {
  let summary = "Fix the issue order of every stream";
  let description = [{
    Orders each device program (receives right before their consumers, sends
    right after their producers, a batch right before its first consumer).
    Whether all programs together finish a step is decided on their plans by
    the plan simulator, the one cross-device progress model: the lowering
    to plans runs it and reports a deadlock with the classes, streams and
    instructions that wait (`piper-plan simulate` reports the same).
  }];
}

def PiperTestPrintCost : Pass<"test-print-cost", "::mlir::ModuleOp"> {
  let summary = "Print the cost of every segment (CostOpInterface)";
  let description = [{
    For every segment, in module order, prints to stdout one line
    `segment @NAME: flops F, bytes B`: the sum of `getFlops` and
    `getBytesMoved` over its ops (structural ops count their results, as
    `stage` does). The IR is not changed.
  }];
}

#endif // PIPER_COMPILER_TRANSFORMS_PASSES_TD
