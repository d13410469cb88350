// Loading an NVIDIA library at run time: see DynamicLibrary.h.
#include "runtime/hal/cuda/DynamicLibrary.h"

#include <dlfcn.h>

namespace piper::runtime::hal {

void *
openFirstLibrary(const std::vector<std::string> &candidates, const char *envVar,
                 bool explicitPath,
                 const std::function<bool(void *, std::string &)> &resolve,
                 const std::string &tooOld, std::string &path,
                 std::string &tried) {
  tried.clear();
  for (const std::string &candidate : candidates) {
    if (!tried.empty())
      tried += "; ";
    tried += "'" + candidate + "'";
    if (explicitPath)
      tried += std::string(" (") + envVar + ")";
    else if (candidate.find('/') == std::string::npos)
      tried += " (default search)";
    dlerror();
    void *handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char *why = dlerror();
      tried += ": " + std::string(why ? why : "dlopen failed");
      continue;
    }
    std::string missing;
    if (!resolve(handle, missing)) {
      tried +=
          ": loaded, but it does not define " + missing + " (" + tooOld + ")";
      dlclose(handle);
      continue;
    }
    path = candidate;
    return handle;
  }
  return nullptr;
}

} // namespace piper::runtime::hal
