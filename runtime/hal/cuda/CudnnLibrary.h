// cuDNN loaded at run time (dlopen), so that piper-run has no DT_NEEDED on
// libcudnn: CPU users and the SIMT attention never need it, and a GPU machine
// may bring its own cuDNN (PyTorch's wheel, the toolkit's). Only the functions
// the fused attention uses are resolved; their types come from cudnn_graph.h
// (decltype), so a mismatch is a compile error.
#ifndef PIPER_RUNTIME_HAL_CUDA_CUDNNLIBRARY_H
#define PIPER_RUNTIME_HAL_CUDA_CUDNNLIBRARY_H

#include <cudnn_graph.h>

#include <string>
#include <vector>

#include "support/Status.h"

namespace piper::runtime::hal {

/// The resolved entry points of one loaded libcudnn (the cuDNN 9 shim, which
/// loads libcudnn_graph and the engine libraries next to it on demand).
struct CudnnLibrary {
  void *handle = nullptr;
  std::string path;   // the file name that was loaded
  size_t version = 0; // cudnnGetVersion's code, e.g. 91900

#define PIPER_CUDNN_FN(name) decltype(&::name) name = nullptr;
#define PIPER_CUDNN_FUNCTIONS(X)                                               \
  X(cudnnGetVersion)                                                           \
  X(cudnnGetErrorString)                                                       \
  X(cudnnGetLastErrorString)                                                   \
  X(cudnnCreate)                                                               \
  X(cudnnDestroy)                                                              \
  X(cudnnSetStream)                                                            \
  X(cudnnBackendCreateDescriptor)                                              \
  X(cudnnBackendDestroyDescriptor)                                             \
  X(cudnnBackendSetAttribute)                                                  \
  X(cudnnBackendGetAttribute)                                                  \
  X(cudnnBackendFinalize)                                                      \
  X(cudnnBackendExecute)
  PIPER_CUDNN_FUNCTIONS(PIPER_CUDNN_FN)
#undef PIPER_CUDNN_FN

  /// "<call> failed: CUDNN_STATUS_... (<cudnnGetLastErrorString>)" for a
  /// call that returned `status`; the last-error text is cuDNN's own
  /// explanation (which attribute, which check) and is read once, here.
  std::string errorText(const std::string &call, cudnnStatus_t status) const;
};

/// Where the loader looks, in order: `$PIPER_CUDNN_LIBRARY` alone when it is
/// set (an explicit choice never falls back to another cuDNN); otherwise
/// "libcudnn.so.9" through the dynamic loader's default search
/// (LD_LIBRARY_PATH, the cache), /usr/local/cuda/lib64/libcudnn.so.9, then
/// PyTorch's wheel (nvidia/cudnn/lib/libcudnn.so.9) in each Python package
/// folder that has one: /usr/local/lib/python3*/dist-packages,
/// /usr/lib/python3/dist-packages, /usr/local/lib/python3*/site-packages,
/// $VIRTUAL_ENV/lib/python3*/site-packages and
/// $HOME/.local/lib/python3*/site-packages (only files that exist are listed).
std::vector<std::string> cudnnLibraryCandidates();

/// Opens the first candidate that loads and resolves every function.
/// Uncached: each call dlopens again (the loader counts references). On
/// failure says what was tried and why each failed (dlerror, or the missing
/// function), and how to fix it.
Status openCudnnLibrary(CudnnLibrary &lib);

/// The process's cuDNN, loaded on first use; later calls return the same
/// library. A failure is not cached (a later call tries again). Thread-safe.
Status cudnnLibrary(const CudnnLibrary *&lib);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_CUDNNLIBRARY_H
