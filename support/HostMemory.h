// How much memory the host can still give a process: what a CPU run (and the
// emulated GPU, whose device memory is host memory) checks a plan's arena
// against before allocating it.
#ifndef PIPER_SUPPORT_HOSTMEMORY_H
#define PIPER_SUPPORT_HOSTMEMORY_H

#include <cstdint>
#include <string>

#include "support/Status.h"

namespace piper {

/// The host's available memory in bytes: MemAvailable of /proc/meminfo
/// (what the kernel can hand out without swapping), else the free physical
/// pages (sysconf); an error when neither is known. A cgroup's limit, when
/// lower, is not seen: the check is a lower bound on what cannot fit.
StatusOr<int64_t> hostAvailableBytes();

/// MemAvailable of a /proc/meminfo text ("MemAvailable:  123456 kB"), in
/// bytes; an error when the line is missing or malformed.
StatusOr<int64_t> memAvailableBytes(const std::string &meminfo);

} // namespace piper

#endif // PIPER_SUPPORT_HOSTMEMORY_H
