// Moved to runtime/support/Precision.h (//runtime/support:precision). This
// forwarding header remains only for runtime/hal/cuda/nccl_gpu_test.cpp,
// which is being edited elsewhere; delete it once that file includes the new
// path (then nothing under runtime/hal includes runtime/exec).
#ifndef PIPER_RUNTIME_EXEC_PRECISION_H
#define PIPER_RUNTIME_EXEC_PRECISION_H

#include "runtime/support/Precision.h"

#endif // PIPER_RUNTIME_EXEC_PRECISION_H
