// piper-context-parallel: the context_parallel directive as a pass with
// typed options, on the forward model before piper-stage. It rewrites the
// model exactly as the JSON directive does (the diffs below), records the
// degree in the module's #piper.mesh, and every option is checked by the
// one verifier of directives.
// RUN: piperc model llama --layers 1 --hidden 16 --heads 4 --kv-heads 2 --ffn 32 --vocab 32 --seq 8 --batch 2 -o %t.mlir
// RUN: piper-opt %t.mlir -piper-context-parallel=cp=2 | FileCheck %s --check-prefix=RING
// RUN: piper-opt %t.mlir -piper-context-parallel=cp=2 > %t.pass.mlir
// RUN: piper-opt %t.mlir '-piper-apply-directive=directive={{"op":"context_parallel","cp":2}}' | diff - %t.pass.mlir
// RUN: piper-opt %t.mlir "-piper-context-parallel=cp=2 kind=ulysses" | FileCheck %s --check-prefix=ULYSSES
// RUN: piper-opt %t.mlir "-piper-context-parallel=cp=2 kind=ulysses" > %t.ulysses.mlir
// RUN: piper-opt %t.mlir '-piper-apply-directive=directive={{"op":"context_parallel","cp":2,"kind":"ulysses"}}' | diff - %t.ulysses.mlir
// RUN: piper-opt %t.mlir "-piper-context-parallel=cp=2 overlap=false stream=ring" | FileCheck %s --check-prefix=SERIAL
// RUN: not piper-opt %t.mlir "-piper-context-parallel=kind=mesh" 2>&1 | FileCheck %s --check-prefix=BAD-KIND
// RUN: not piper-opt %t.mlir "-piper-context-parallel=cp=2 kind=ulysses overlap=false" 2>&1 | FileCheck %s --check-prefix=OVERLAP
// RUN: not piper-opt %t.mlir -piper-context-parallel=cp=1 2>&1 | FileCheck %s --check-prefix=ONE
// RUN: piper-opt --help | FileCheck %s --check-prefix=HELP

// RING: module attributes {piper.context_parallel_stream = "cp_stream", piper.mesh = #piper.mesh<cp = 2>}
// RING-LABEL: piper.segment @embed(%arg0: tensor<2x4xi32>) -> tensor<8x16xf32>
// RING-LABEL: piper.segment @block0(
// RING: piper.cp_attention %{{[0-9]+}} {cp = 2 : i64, heads = 4 : i64, kv_heads = 2 : i64

// ULYSSES: piper.mesh = #piper.mesh<cp = 2>
// ULYSSES: piper.cp_seq_to_heads
// ULYSSES-NEXT: piper.attention %{{[0-9]+}} {heads = 2 : i64, kv_heads = 1 : i64
// ULYSSES-NEXT: piper.cp_heads_to_seq

// SERIAL: module attributes {piper.context_parallel_overlap = false, piper.context_parallel_stream = "ring", piper.mesh = #piper.mesh<cp = 2>}

// BAD-KIND: for the --kind option: Cannot find option named 'mesh'!
// OVERLAP: error: directive #0 (piper-context-parallel cp=2 kind=ulysses): "overlap" orders the ring's exchanges; kind "ulysses" has none to order
// ONE: error: directive #0 (piper-context-parallel cp=1 kind=ring): "cp" must be between 2 and 1048576, got 1

// HELP: --piper-context-parallel
// HELP-NEXT: --cp=<long>
// HELP-NEXT: --kind=<value>
// HELP-NEXT: =ring
// HELP-NEXT: =ulysses
// HELP-NEXT: --overlap
// HELP-NEXT: --stream=<string>
