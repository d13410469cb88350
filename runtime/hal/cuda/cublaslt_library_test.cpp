// How cuBLASLt is found at run time, and the error when it is not, and the
// operand alignment GEMMs tell it; runs on any machine with the toolkit (no
// GPU, no driver needed).
#include <catch2/catch.hpp>

#include <link.h>

#include <cstdlib>
#include <string>

#include "runtime/hal/cuda/CudaKernelContext.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {
bool loaded(const std::string &needle) {
  struct Search {
    std::string needle;
    bool found = false;
  } search{needle};
  dl_iterate_phdr(
      [](struct dl_phdr_info *info, size_t, void *data) {
        auto *s = static_cast<Search *>(data);
        if (info->dlpi_name &&
            std::string(info->dlpi_name).find(s->needle) != std::string::npos)
          s->found = true;
        return 0;
      },
      &search);
  return search.found;
}
} // namespace

// One test case: loadCublasLt() decides once per process.
TEST_CASE("cuBLASLt is loaded at run time, and a chosen library that does "
          "not load is an error naming it") {
  // No DT_NEEDED: the CPU backend never needs it.
  CHECK_FALSE(loaded("libcublasLt"));
  setenv("PIPER_CUBLASLT_LIBRARY", "/nonexistent/libcublasLt.so.13", 1);
  Status st = loadCublasLt();
  REQUIRE_FALSE(st);
  INFO(st.message());
  CHECK(st.message().find("cannot load cuBLASLt: tried "
                          "/nonexistent/libcublasLt.so.13") !=
        std::string::npos);
  CHECK(st.message().find("PIPER_CUBLASLT_LIBRARY") != std::string::npos);
  CHECK_FALSE(loaded("libcublasLt"));
}

// gpu-review A.4: cuBLASLt's heuristic assumes 256-byte-aligned operands;
// GEMMs tell it the real alignment of each pointer and column stride.
TEST_CASE("GEMM operands' alignment: the lowest set bit of the pointer and "
          "the column stride, at most 256") {
  auto at = [](uintptr_t address) {
    return reinterpret_cast<const void *>(address);
  };
  CHECK(matrixAlignment(at(0x7f0000000000), 1024, 4) == 256);
  CHECK(matrixAlignment(at(0x7f0000000040), 1024, 4) == 64); // an arena offset
  CHECK(matrixAlignment(at(0x7f0000000004), 1024, 4) == 4);  // a MoE slice
  // GPT-2's vocab 50257 as a leading dimension: bf16 columns 2-byte aligned.
  CHECK(matrixAlignment(at(0x7f0000000000), 50257, 2) == 2);
  CHECK(matrixAlignment(at(0x7f0000000000), 50257, 4) == 4);
  CHECK(matrixAlignment(at(0x7f0000000000), 768, 2) == 256);
  CHECK(matrixAlignment(at(0x7f0000000000), 40, 4) == 32);
}
