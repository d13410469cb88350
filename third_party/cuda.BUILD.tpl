# Generated from //third_party:cuda.BUILD.tpl for the CUDA toolkit at %{CUDA_PATH}
# (build_defs/system_repo.bzl: system_cuda). Without a toolkit,
# //third_party:cuda_none.BUILD.tpl defines the same targets, empty.
package(default_visibility = ["//visibility:public"])

cc_library(
    name = "headers",
    # CUDA 13 keeps CCCL (nv/target, cuda/std, cub, thrust) in include/cccl, which
    # cuda_fp16.h (pulled in by cublas_v2.h) needs; nvcc adds it implicitly, g++ does not.
    hdrs = glob(["include/**"]),
    includes = ["include", "include/cccl"],
)

cc_import(name = "cudart_so", shared_library = "lib/%{CUDART}")

# alwayslink: in fastbuild tests, libraries are shared objects whose CUDA
# calls only the test binary can satisfy; link every member there.
cc_import(name = "cudart_a", static_library = "lib/libcudart_static.a", alwayslink = True)

cc_import(name = "cublas_so", shared_library = "lib/%{CUBLAS}")

cc_import(name = "cublaslt_so", shared_library = "lib/%{CUBLASLT}")

cc_import(name = "nccl_so", shared_library = "lib/%{NCCL}")

cc_library(
    name = "cudart",
    deps = [":headers", ":cudart_so"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
)

# The CUDA runtime linked statically: a binary needs no libcudart.so at run
# time (it loads the driver's libcuda.so itself, when there is one).
cc_library(
    name = "cudart_static",
    deps = [":headers", ":cudart_a"],
    linkopts = ["-ldl", "-lpthread", "-lrt"],
)

cc_library(name = "cublas", deps = [":cudart", ":cublas_so", ":cublaslt_so"])

cc_library(name = "nccl", deps = [":cudart", ":nccl_so"])

exports_files(["bin/nvcc"])
