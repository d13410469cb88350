// The text of an errno value as Piper's messages write it.
#ifndef PIPER_SUPPORT_ERRNO_H
#define PIPER_SUPPORT_ERRNO_H

#include <string>

namespace piper {

/// strerror() text, lowercased (Piper's messages are lowercase):
/// errnoMessage(ENOENT) is "no such file or directory".
std::string errnoMessage(int err);

} // namespace piper

#endif // PIPER_SUPPORT_ERRNO_H
