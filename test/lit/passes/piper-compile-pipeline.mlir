// piper-compile-pipeline runs the pipeline piperc runs: the same passes, the
// same IR, phase by phase.
// RUN: piper-opt %S/Inputs/model.mlir -piper-compile-pipeline="strategy=%S/Inputs/pp2dp2.json" -o %t.opt.mlir
// RUN: piperc compile %S/Inputs/model.mlir --strategy %S/Inputs/pp2dp2.json --compile-to streams -o %t.piperc.mlir
// RUN: diff %t.opt.mlir %t.piperc.mlir
// RUN: piper-opt %S/Inputs/model.mlir -piper-compile-pipeline="strategy=%S/Inputs/pp2dp2.json phase=directives" -o %t.opt-dir.mlir
// RUN: piperc compile %S/Inputs/model.mlir --strategy %S/Inputs/pp2dp2.json --compile-to directives -o %t.piperc-dir.mlir
// RUN: diff %t.opt-dir.mlir %t.piperc-dir.mlir
// RUN: FileCheck %s < %t.opt.mlir
// RUN: not piper-opt %S/Inputs/model.mlir -piper-compile-pipeline="strategy=%S/Inputs/pp2dp2.json phase=plan" 2>&1 | FileCheck %s --check-prefix=PHASE
// RUN: not piper-opt %S/Inputs/model.mlir -piper-compile-pipeline="strategy=%S/Inputs/missing.json" 2>&1 | FileCheck %s --check-prefix=MISSING

// CHECK: piper.device_program @class0
// CHECK: piper.device_program @class1

// PHASE: error: piper-compile-pipeline: unknown phase 'plan' (stage, training-dag, directives, devices or streams)
// MISSING: error: piper-compile-pipeline: strategy file '{{.*}}missing.json': cannot open: no such file or directory
