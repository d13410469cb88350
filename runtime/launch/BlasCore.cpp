// Choosing OpenBLAS's kernel core for CPUs it does not recognise, by
// re-executing piper-run with OPENBLAS_CORETYPE set.
#include "runtime/launch/BlasCore.h"

#include <cstdlib>

#include <unistd.h>

#include <cblas.h>

namespace piper::runtime {

std::string fallbackBlasCore(const std::string &detected, bool avx512f,
                             bool avx2) {
  if (detected != "Prescott")
    return "";
  if (avx512f)
    return "SkylakeX";
  if (avx2)
    return "Haswell";
  return "";
}

void useFastBlasCore(char **argv) {
  if (std::getenv("OPENBLAS_CORETYPE"))
    return;
  const char *test = std::getenv("PIPER_TEST_BLAS_CORE");
  const char *core = test && *test ? test : openblas_get_corename();
  // __builtin_cpu_supports also checks that the OS saves the AVX registers.
  std::string choice =
      fallbackBlasCore(core ? core : "", __builtin_cpu_supports("avx512f"),
                       __builtin_cpu_supports("avx2"));
  if (choice.empty())
    return;
  if (::setenv("OPENBLAS_CORETYPE", choice.c_str(), 1) != 0)
    return;
  ::execv("/proc/self/exe", argv);
  // Not re-executed: run on with OpenBLAS's own choice, and do not hand
  // the variable to ranks that would then use other kernels than this one.
  ::unsetenv("OPENBLAS_CORETYPE");
}

} // namespace piper::runtime
