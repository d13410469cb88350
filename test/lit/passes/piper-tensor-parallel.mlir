// piper-tensor-parallel: without shard_tensor's degree on the module, a
// stray f or g is an error; the shard_tensor rewrite's own errors on
// models it cannot split.
// RUN: piper-opt %s -split-input-file -piper-tensor-parallel -verify-diagnostics

piper.segment @s(%x: tensor<8x4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'piper.tp_reduce' op needs the module's tensor-parallel degree (the tp of piper.mesh, set by shard_tensor)}}
  %y = piper.tp_reduce %x : tensor<8x4xf32>
  piper.yield %y : tensor<8x4xf32>
}
