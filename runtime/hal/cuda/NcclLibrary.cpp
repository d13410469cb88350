// Loading NCCL at run time: see NcclLibrary.h.
#include "runtime/hal/cuda/NcclLibrary.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

#include "runtime/hal/cuda/DynamicLibrary.h"

namespace piper::runtime::hal {

namespace {

/// Resolves every function of `lib` from `handle`; the first missing one is
/// named in `missing`.
bool resolve(void *handle, NcclLibrary &lib, std::string &missing) {
#define PIPER_NCCL_RESOLVE(name)                                               \
  lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(handle, #name));       \
  if (!lib.name) {                                                             \
    missing = #name;                                                           \
    return false;                                                              \
  }
  PIPER_NCCL_FUNCTIONS(PIPER_NCCL_RESOLVE)
#undef PIPER_NCCL_RESOLVE
  return true;
}

} // namespace

std::vector<std::string> ncclLibraryCandidates() {
  const char *env = std::getenv("PIPER_NCCL_LIBRARY");
  if (env && *env)
    return {env};
  return {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2"};
}

Status openNcclLibrary(NcclLibrary &lib) {
  const char *env = std::getenv("PIPER_NCCL_LIBRARY");
  const bool explicitPath = env && *env;
  NcclLibrary found;
  std::string tried, path;
  void *handle = openFirstLibrary(
      ncclLibraryCandidates(), "PIPER_NCCL_LIBRARY", explicitPath,
      [&](void *h, std::string &missing) { return resolve(h, found, missing); },
      "not NCCL, or an NCCL older than 2.14", path, tried);
  if (handle) {
    found.handle = handle;
    found.path = path;
    if (found.ncclGetVersion(&found.version) != ncclSuccess)
      found.version = 0;
    lib = found;
    return Status::ok();
  }
  return Status::error(
      "cannot load the NCCL library (libnccl.so.2): tried " + tried + ". " +
      (explicitPath ? std::string("Point PIPER_NCCL_LIBRARY at libnccl.so.2, "
                                  "or unset it to search the default places")
                    : std::string("Install NCCL (e.g. pip's nvidia-nccl-cu13 "
                                  "or the toolkit's), add its folder to "
                                  "LD_LIBRARY_PATH or set PIPER_NCCL_LIBRARY "
                                  "to its path")) +
      "; or run the ranks with --comm gloo");
}

Status ncclLibrary(const NcclLibrary *&lib) {
  static std::mutex mu;
  static NcclLibrary loaded;
  static bool ok = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!ok) {
    PIPER_RETURN_IF_ERROR(openNcclLibrary(loaded));
    ok = true;
  }
  lib = &loaded;
  return Status::ok();
}

} // namespace piper::runtime::hal
