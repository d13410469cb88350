# Generated from //third_party:llvm.BUILD.tpl for Debian LLVM/MLIR %{LLVM_VERSION}.
# Only the compiler side may use LLVM/MLIR: the runtime's only contract with
# the compiler is plan.proto (a runtime target depending on this fails).
package(default_visibility = [
    "@//compiler:__subpackages__",
    "@//dialects:__subpackages__",
    "@//test:__subpackages__",
    "@//tools:__pkg__",
])

cc_library(
    name = "headers",
    hdrs = glob(["include/**/*.h", "include/**/*.inc"]),
    textual_hdrs = glob(["include/**/*.def"]),
    includes = ["include"],
)

cc_import(name = "libmlir_so", shared_library = "lib/%{MLIR_SO}")

cc_import(name = "libllvm_so", shared_library = "lib/%{LLVM_SO}")

cc_library(name = "llvm", deps = [":headers", ":libllvm_so"])

cc_library(name = "mlir", deps = [":headers", ":libmlir_so", ":libllvm_so"])

filegroup(name = "td_files", srcs = glob(["include/**/*.td"]))

exports_files([
    "bin/mlir-tblgen",
    "bin/mlir-opt",
    "bin/FileCheck",
    "bin/not",
    "bin/count",
    "lit_runner",
])
