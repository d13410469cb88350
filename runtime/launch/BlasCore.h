// OpenBLAS's fast kernels for piper-run on CPUs that OpenBLAS 0.3.21 does
// not recognise (it falls back to its generic Prescott kernels).
#ifndef PIPER_RUNTIME_LAUNCH_BLASCORE_H
#define PIPER_RUNTIME_LAUNCH_BLASCORE_H

#include <string>

namespace piper::runtime {

/// The OPENBLAS_CORETYPE to ask for when OpenBLAS detected `detected` on a
/// CPU with (or without) AVX-512F and AVX2: "SkylakeX" or "Haswell" in
/// place of the generic "Prescott", else "" (keep OpenBLAS's choice).
std::string fallbackBlasCore(const std::string &detected, bool avx512f,
                             bool avx2);

/// When OPENBLAS_CORETYPE is unset and OpenBLAS fell back to Prescott on a
/// CPU with AVX-512F or AVX2, re-executes this program (/proc/self/exe with
/// `argv`) with OPENBLAS_CORETYPE=SkylakeX or Haswell: OpenBLAS reads the
/// variable once, when the library loads, before main. Returns (doing
/// nothing) otherwise, or when the exec fails. A user's explicit
/// OPENBLAS_CORETYPE, even an empty one, is never overridden.
/// PIPER_TEST_BLAS_CORE, for tests, stands in for the detected core.
void useFastBlasCore(char **argv);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_LAUNCH_BLASCORE_H
