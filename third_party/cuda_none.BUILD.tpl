# Generated from //third_party:cuda_none.BUILD.tpl: there was no CUDA toolkit
# at %{CUDA_PATH} (no bin/nvcc) when this repository was set up. The targets
# of //third_party:cuda.BUILD.tpl exist, empty, so that the CPU-only build
# loads; @cuda//:defs.bzl says CUDA_AVAILABLE = False and the CUDA parts of
# the project are left out (docs/gpu.md). bin/nvcc fails with a message.
package(default_visibility = ["//visibility:public"])

cc_library(name = "headers")

cc_library(name = "cudart")

cc_library(name = "cudart_static")

cc_library(name = "cublas")

cc_library(name = "nccl")

exports_files(["bin/nvcc"])
