// How cuBLASLt is found at run time, and the error when it is not; runs on
// any machine with the toolkit (no GPU, no driver needed).
#include <catch2/catch.hpp>

#include <link.h>

#include <cstdlib>
#include <string>

#include "runtime/hal/cuda/CudaKernelContext.h"

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
