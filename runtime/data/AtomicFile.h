// Moved to runtime/support/AtomicFile.h (//runtime/support:atomic_file).
// This forwarding header remains only for runtime/launch/RunRank.cpp, which
// is being edited elsewhere; delete it once that file includes the new path.
#ifndef PIPER_RUNTIME_DATA_ATOMICFILE_H
#define PIPER_RUNTIME_DATA_ATOMICFILE_H

#include "runtime/support/AtomicFile.h"

#endif // PIPER_RUNTIME_DATA_ATOMICFILE_H
