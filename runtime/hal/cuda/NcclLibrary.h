// NCCL loaded at run time (dlopen), so that piper-run has no DT_NEEDED on
// libnccl: CPU users never need it, and a GPU machine may bring its own
// NCCL. Only the functions the NCCL communicator uses are resolved; their
// types come from nccl.h (decltype), so a mismatch is a compile error.
#ifndef PIPER_RUNTIME_HAL_CUDA_NCCLLIBRARY_H
#define PIPER_RUNTIME_HAL_CUDA_NCCLLIBRARY_H

#include <nccl.h>

#include <string>
#include <vector>

#include "support/Status.h"

namespace piper::runtime::hal {

/// The resolved entry points of one loaded libnccl.
struct NcclLibrary {
  void *handle = nullptr;
  std::string path; // the file name that was loaded
  int version = 0;  // ncclGetVersion's code, e.g. 22809

#define PIPER_NCCL_FN(name) decltype(&::name) name = nullptr;
#define PIPER_NCCL_FUNCTIONS(X)                                                \
  X(ncclGetVersion)                                                            \
  X(ncclGetUniqueId)                                                           \
  X(ncclCommInitRank)                                                          \
  X(ncclCommFinalize)                                                          \
  X(ncclCommDestroy)                                                           \
  X(ncclCommAbort)                                                             \
  X(ncclCommGetAsyncError)                                                     \
  X(ncclGetErrorString)                                                        \
  X(ncclGetLastError)                                                          \
  X(ncclAllReduce)                                                             \
  X(ncclReduceScatter)                                                         \
  X(ncclAllGather)                                                             \
  X(ncclReduce)                                                                \
  X(ncclBroadcast)                                                             \
  X(ncclSend)                                                                  \
  X(ncclRecv)                                                                  \
  X(ncclGroupStart)                                                            \
  X(ncclGroupEnd)
  PIPER_NCCL_FUNCTIONS(PIPER_NCCL_FN)
#undef PIPER_NCCL_FN
};

/// Where the loader looks, in order: `$PIPER_NCCL_LIBRARY` alone when it is
/// set (an explicit choice never falls back to another NCCL); otherwise
/// "libnccl.so.2" through the dynamic loader's default search
/// (LD_LIBRARY_PATH, the cache), then /usr/local/cuda/lib64/libnccl.so.2.
std::vector<std::string> ncclLibraryCandidates();

/// Opens the first candidate that loads and resolves every function.
/// Uncached: each call dlopens again (the loader counts references). On
/// failure says what was tried and why each failed (dlerror, or the missing
/// function), and how to fix it.
Status openNcclLibrary(NcclLibrary &lib);

/// The process's NCCL, loaded on first use; later calls return the same
/// library. A failure is not cached (a later call tries again). Thread-safe.
Status ncclLibrary(const NcclLibrary *&lib);

} // namespace piper::runtime::hal

#endif // PIPER_RUNTIME_HAL_CUDA_NCCLLIBRARY_H
