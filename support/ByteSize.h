// Memory sizes as people write them on a command line (--device-memory):
// shared by piperc, piper-plan and piper-run.
#ifndef PIPER_SUPPORT_BYTESIZE_H
#define PIPER_SUPPORT_BYTESIZE_H

#include <cstdint>
#include <string>

#include "support/Status.h"

namespace piper {

/// A memory size: a number of bytes, or a number with a unit (KiB, MiB,
/// GiB, TiB: powers of 1024; KB, MB, GB, TB: powers of 1000; B), blanks
/// around it allowed ("80GiB", "1.5 TB", "1e9"). An error (naming `text`
/// and the accepted forms) for anything else, a negative size, or one past
/// int64_t.
StatusOr<int64_t> parseByteSize(const std::string &text);

} // namespace piper

#endif // PIPER_SUPPORT_BYTESIZE_H
