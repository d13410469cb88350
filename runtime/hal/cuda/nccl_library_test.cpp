// How NCCL is found at run time, and the errors when it is not; runs on any
// machine with the toolkit (no GPU, no driver needed).
#include <catch2/catch.hpp>

#include <link.h>

#include <cstdlib>
#include <string>
#include <unistd.h>

#include "runtime/hal/cuda/NcclCommunicator.h"
#include "runtime/hal/cuda/NcclLibrary.h"

using namespace piper;

using namespace piper::runtime;
using namespace piper::runtime::hal;

namespace {

/// Whether an object whose name contains `needle` is loaded in the process.
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

std::shared_ptr<gloo::rendezvous::Store> NoStore() { return nullptr; }

/// Sets PIPER_NCCL_LIBRARY for one scope.
struct EnvLibrary {
  explicit EnvLibrary(const char *value) {
    setenv("PIPER_NCCL_LIBRARY", value, 1);
  }
  ~EnvLibrary() { unsetenv("PIPER_NCCL_LIBRARY"); }
};

} // namespace

// First, before anything dlopens NCCL: linking the communicator does not
// load libnccl (no DT_NEEDED), so CPU-only users never need it.
TEST_CASE("linking the NCCL communicator does not load libnccl", "[nccl]") {
  CHECK_FALSE(loaded("libnccl"));
}

TEST_CASE("the loader looks at PIPER_NCCL_LIBRARY alone when it is set",
          "[nccl]") {
  unsetenv("PIPER_NCCL_LIBRARY");
  CHECK(ncclLibraryCandidates() ==
        std::vector<std::string>{"libnccl.so.2",
                                 "/usr/local/cuda/lib64/libnccl.so.2"});
  EnvLibrary env("/opt/nccl/libnccl.so.2");
  CHECK(ncclLibraryCandidates() ==
        std::vector<std::string>{"/opt/nccl/libnccl.so.2"});
}

TEST_CASE("a missing NCCL library is a clear error naming what was tried",
          "[nccl]") {
  EnvLibrary env("/nonexistent/libnccl.so.2");
  NcclLibrary lib;
  Status st = openNcclLibrary(lib);
  REQUIRE_FALSE(st);
  INFO(st.message());
  CHECK(st.message().find("cannot load the NCCL library (libnccl.so.2): "
                          "tried '/nonexistent/libnccl.so.2' "
                          "(PIPER_NCCL_LIBRARY): ") == 0);
  CHECK(st.message().find("No such file or directory") != std::string::npos);
  CHECK(st.message().find("Point PIPER_NCCL_LIBRARY at libnccl.so.2") !=
        std::string::npos);
  CHECK(st.message().find("--comm gloo") != std::string::npos);
  CHECK(lib.handle == nullptr);
  CHECK_FALSE(loaded("libnccl"));
}

TEST_CASE("a library that is not NCCL is named with the missing function",
          "[nccl]") {
  EnvLibrary env("libm.so.6");
  NcclLibrary lib;
  Status st = openNcclLibrary(lib);
  REQUIRE_FALSE(st);
  INFO(st.message());
  CHECK(st.message().find("'libm.so.6' (PIPER_NCCL_LIBRARY): loaded, but it "
                          "does not define ncclGetVersion") !=
        std::string::npos);
}

TEST_CASE("the factory checks its arguments before loading NCCL", "[nccl]") {
  Status st;
  CHECK_FALSE(createNcclCommunicator(2, 2, 0, NoStore(),
                                     std::chrono::milliseconds(1000), st));
  CHECK(st.message() == "rank 2: creating the NCCL communicator failed: rank "
                        "outside the world of 2 ranks");
  CHECK_FALSE(createNcclCommunicator(0, 2, 0, NoStore(),
                                     std::chrono::milliseconds(0), st));
  CHECK(st.message() == "rank 0: creating the NCCL communicator failed: the "
                        "timeout must be positive");
  CHECK_FALSE(createNcclCommunicator(0, 2, 0, NoStore(),
                                     std::chrono::milliseconds(1000), st));
  CHECK(st.message() == "rank 0: creating the NCCL communicator failed: no "
                        "rendezvous store");
  CHECK_FALSE(createNcclCommunicator(0, 2, 0, "/nonexistent/store",
                                     std::chrono::milliseconds(1000), st));
  CHECK(st.message() == "rank 0: creating the NCCL communicator failed: store "
                        "directory '/nonexistent/store' does not exist");
}

TEST_CASE("the toolkit's NCCL loads and resolves every function", "[nccl]") {
  unsetenv("PIPER_NCCL_LIBRARY");
  if (access("/usr/local/cuda/lib64/libnccl.so.2", R_OK) != 0) {
    WARN("no /usr/local/cuda/lib64/libnccl.so.2 here: not checked");
    return;
  }
  NcclLibrary lib;
  Status st = openNcclLibrary(lib);
  INFO(st.message());
  REQUIRE(st);
  CHECK(lib.handle != nullptr);
  CHECK(lib.ncclGroupEnd != nullptr);
  CHECK(lib.version >= 21400); // 2.14: ncclCommFinalize
  CHECK(std::string(lib.ncclGetErrorString(ncclInvalidArgument)).size() > 0);
  CHECK(loaded("libnccl"));

  // Without a usable GPU the factory says why (CUDA's own error); with one
  // it succeeds without meeting anyone.
  Status made;
  auto comm = createNcclCommunicator(0, 1, 0, NoStore(),
                                     std::chrono::milliseconds(1000), made);
  INFO(made.message());
  if (!comm)
    CHECK(made.message().find("rank 0: creating the NCCL communicator "
                              "failed: cudaGetDeviceCount") == 0);
  else
    CHECK(comm->worldSize() == 1);
}
