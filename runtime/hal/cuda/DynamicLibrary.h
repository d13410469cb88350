// Loading an NVIDIA library at run time (dlopen), for the libraries that
// piper-run must not depend on at link time (NCCL, cuDNN): the first of a
// list of candidates that loads and defines every function wanted.
#ifndef PIPER_RUNTIME_HAL_CUDA_DYNAMICLIBRARY_H
#define PIPER_RUNTIME_HAL_CUDA_DYNAMICLIBRARY_H

#include <functional>
#include <string>
#include <vector>

namespace piper::runtime::hal {

/// Tries `candidates` in order (dlopen RTLD_NOW | RTLD_LOCAL) and calls
/// `resolve(handle, missing)` on each that loads; returns the first handle
/// it accepts (`path` names it), or null. `tried` lists every candidate
/// that did not do and why: "'<path>' (<envVar>)" when `explicitPath`, or
/// " (default search)" for a bare name, then dlerror's message or "loaded,
/// but it does not define <missing> (<tooOld>)" (that handle is closed).
void *
openFirstLibrary(const std::vector<std::string> &candidates, const char *envVar,
                 bool explicitPath,
                 const std::function<bool(void *, std::string &)> &resolve,
                 const std::string &tooOld, std::string &path,
                 std::string &tried);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_DYNAMICLIBRARY_H
