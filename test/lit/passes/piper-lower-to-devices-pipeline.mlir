// The registered pipeline runs exactly the per-device split and the stream
// order, as piperc does after the directives.
// RUN: piper-opt %S/Inputs/model.mlir -piper-apply-strategy="file=%S/Inputs/pp2.json" -piper-lower-to-devices-pipeline | FileCheck %s
// RUN: piper-opt %S/Inputs/model.mlir -piper-apply-strategy="file=%S/Inputs/pp2.json" -piper-split-devices -piper-order-streams > %t.passes.mlir
// RUN: piper-opt %S/Inputs/model.mlir -piper-apply-strategy="file=%S/Inputs/pp2.json" -piper-lower-to-devices-pipeline > %t.pipeline.mlir
// RUN: diff %t.passes.mlir %t.pipeline.mlir

// CHECK-NOT: piper.program
// CHECK-LABEL: piper.device_program @class0
// CHECK: piper.send
// CHECK-LABEL: piper.device_program @class1
// CHECK: piper.recv
