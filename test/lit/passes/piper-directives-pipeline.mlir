// piper-directives-pipeline: the directive phase of a strategy file, as
// piperc runs it after stage and autodiff: one piper-apply-directive per
// directive in phase order, with the phase-ending passes between. Any
// prefix of it runs alone in piper-opt: spelled out pass by pass, the same
// strategy gives the same IR.
// RUN: piper-opt %S/Inputs/model.mlir -piper-stage=stages=2 -piper-build-training-dag \
// RUN:   -piper-directives-pipeline="strategy=%S/Inputs/pp2dp2.json" -o %t.pipeline.mlir
// RUN: piper-opt %S/Inputs/model.mlir -piper-compile-pipeline="strategy=%S/Inputs/pp2dp2.json phase=directives" -o %t.compile.mlir
// RUN: diff %t.pipeline.mlir %t.compile.mlir
// RUN: piper-opt %S/Inputs/model.mlir -piper-stage=stages=2 -piper-build-training-dag \
// RUN:   '-piper-apply-directive=directive={{"op":"split","num_microbatches":1}}' \
// RUN:   '-piper-apply-directive=directive={{"op":"place","filter":{"PP":0},"devices":[0,1]}} world-size=4' \
// RUN:   '-piper-apply-directive=directive={{"op":"place","filter":{"PP":1},"devices":[2,3]}} world-size=4' \
// RUN:   -piper-finalize-placement=world-size=4 \
// RUN:   '-piper-apply-directive=directive={{"op":"replicate","filter":{"PP":0},"devices":[0,1],"bucket_size":0.0002}} world-size=4' \
// RUN:   '-piper-apply-directive=directive={{"op":"replicate","filter":{"PP":1},"devices":[2,3],"reduce_stream":"ar"}} world-size=4' \
// RUN:   -piper-tie-params -piper-bound-zero-collectives -o %t.spelled.mlir
// RUN: diff %t.pipeline.mlir %t.spelled.mlir
// RUN: FileCheck %s < %t.pipeline.mlir
// The pipeline's passes, printed by the pass manager.
// RUN: piper-opt %S/Inputs/model.mlir -piper-stage=stages=2 -piper-build-training-dag \
// RUN:   -piper-directives-pipeline="strategy=%S/Inputs/pp2dp2.json" -mlir-print-ir-after-all -o /dev/null 2>&1 | FileCheck %s --check-prefix=PASSES
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-directives-pipeline="strategy=%S/Inputs/two-splits.json" 2>&1 | FileCheck %s --check-prefix=TWO
// RUN: not piper-opt %S/Inputs/dag.mlir -piper-directives-pipeline="strategy=%S/Inputs/missing.json" 2>&1 | FileCheck %s --check-prefix=MISSING

// CHECK: piper.all_reduce grads [@lm] {{.*}}devices = #piper.group<2, 3>, stream = #piper.stream<"ar", comm>
// CHECK: piper.all_reduce grads [@b1, @w1] {{.*}}devices = #piper.group<0, 1>, stream = #piper.stream<"dp_stream", comm>
// CHECK: piper.all_reduce grads [@wte] {{.*}}devices = #piper.group<0, 1>

// PASSES: IR Dump After PiperApplyDirective(split) (piper-apply-directive)
// PASSES: IR Dump After PiperApplyDirective(place) (piper-apply-directive)
// PASSES: IR Dump After PiperApplyDirective(place) (piper-apply-directive)
// PASSES: IR Dump After PiperFinalizePlacement (piper-finalize-placement)
// PASSES: IR Dump After PiperApplyDirective(replicate) (piper-apply-directive)
// PASSES: IR Dump After PiperApplyDirective(replicate) (piper-apply-directive)
// PASSES: IR Dump After PiperTieParams (piper-tie-params)
// PASSES: IR Dump After PiperBoundZeroCollectives (piper-bound-zero-collectives)

// TWO: error: directive #1 ({"num_microbatches":4,"op":"split"}): only one split directive is allowed
// MISSING: error: piper-directives-pipeline: strategy file '{{.*}}missing.json': cannot open: no such file or directory
