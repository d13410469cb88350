// Loading cuDNN at run time: see CudnnLibrary.h.
#include "runtime/hal/cuda/CudnnLibrary.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <mutex>

#include "runtime/hal/cuda/DynamicLibrary.h"

namespace piper::runtime::hal {

namespace {

/// Resolves every function of `lib` from `handle`; the first missing one is
/// named in `missing`.
bool resolve(void *handle, CudnnLibrary &lib, std::string &missing) {
#define PIPER_CUDNN_RESOLVE(name)                                              \
  lib.name = reinterpret_cast<decltype(lib.name)>(dlsym(handle, #name));       \
  if (!lib.name) {                                                             \
    missing = #name;                                                           \
    return false;                                                              \
  }
  PIPER_CUDNN_FUNCTIONS(PIPER_CUDNN_RESOLVE)
#undef PIPER_CUDNN_RESOLVE
  return true;
}

/// Appends the files matching `pattern` (sorted, as glob returns them).
void appendMatches(const std::string &pattern, std::vector<std::string> &out) {
  glob_t matches;
  if (glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      std::string path = matches.gl_pathv[i];
      bool seen = false;
      for (const std::string &have : out)
        seen = seen || have == path;
      if (!seen)
        out.push_back(path);
    }
  }
  globfree(&matches);
}

} // namespace

std::string CudnnLibrary::errorText(const std::string &call,
                                    cudnnStatus_t status) const {
  std::string text = call + " failed: ";
  const char *name = cudnnGetErrorString ? cudnnGetErrorString(status) : "";
  text += name && *name ? name : "status " + std::to_string(int(status));
  if (cudnnGetLastErrorString) {
    char last[1024] = {0};
    cudnnGetLastErrorString(last, sizeof(last));
    if (last[0])
      text += std::string(" (") + last + ")";
  }
  return text;
}

std::vector<std::string> cudnnLibraryCandidates() {
  const char *env = std::getenv("PIPER_CUDNN_LIBRARY");
  if (env && *env)
    return {env};
  std::vector<std::string> out = {"libcudnn.so.9",
                                  "/usr/local/cuda/lib64/libcudnn.so.9"};
  // PyTorch's pip wheel brings cuDNN as the nvidia-cudnn-cu* package; its
  // library is found under the interpreter's package folders, which glob
  // lists cheaply (no interpreter is started).
  const std::string wheel = "/nvidia/cudnn/lib/libcudnn.so.9";
  appendMatches("/usr/local/lib/python3*/dist-packages" + wheel, out);
  appendMatches("/usr/lib/python3/dist-packages" + wheel, out);
  appendMatches("/usr/local/lib/python3*/site-packages" + wheel, out);
  if (const char *venv = std::getenv("VIRTUAL_ENV"); venv && *venv)
    appendMatches(std::string(venv) + "/lib/python3*/site-packages" + wheel,
                  out);
  if (const char *home = std::getenv("HOME"); home && *home)
    appendMatches(
        std::string(home) + "/.local/lib/python3*/site-packages" + wheel, out);
  return out;
}

Status openCudnnLibrary(CudnnLibrary &lib) {
  const char *env = std::getenv("PIPER_CUDNN_LIBRARY");
  const bool explicitPath = env && *env;
  CudnnLibrary found;
  std::string tried, path;
  // cudnnGetLastErrorString and the backend API as used here are cuDNN 9's.
  void *handle = openFirstLibrary(
      cudnnLibraryCandidates(), "PIPER_CUDNN_LIBRARY", explicitPath,
      [&](void *h, std::string &missing) { return resolve(h, found, missing); },
      "not cuDNN, or a cuDNN older than 9.0", path, tried);
  if (handle) {
    found.handle = handle;
    found.path = path;
    found.version = found.cudnnGetVersion();
    lib = found;
    return Status::ok();
  }
  return Status::error(
      "cannot load the cuDNN library (libcudnn.so.9): tried " + tried + ". " +
      (explicitPath
           ? std::string("Point PIPER_CUDNN_LIBRARY at libcudnn.so.9, "
                         "or unset it to search the default places")
           : std::string("Install cuDNN 9 (e.g. pip's nvidia-cudnn-cu13 "
                         "or the toolkit's), add its folder to "
                         "LD_LIBRARY_PATH or set PIPER_CUDNN_LIBRARY "
                         "to its path")) +
      "; or run with --attention simt");
}

Status cudnnLibrary(const CudnnLibrary *&lib) {
  static std::mutex mu;
  static CudnnLibrary loaded;
  static bool ok = false;
  std::lock_guard<std::mutex> lock(mu);
  if (!ok) {
    PIPER_RETURN_IF_ERROR(openCudnnLibrary(loaded));
    ok = true;
  }
  lib = &loaded;
  return Status::ok();
}

} // namespace piper::runtime::hal
