// The text of an errno value as Piper's messages write it.
#ifndef PIPER_RUNTIME_SUPPORT_ERRNO_H
#define PIPER_RUNTIME_SUPPORT_ERRNO_H

#include <string>

namespace piper::runtime {

/// strerror() text, lowercased (Piper's messages are lowercase):
/// errnoMessage(ENOENT) is "no such file or directory".
std::string errnoMessage(int err);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_SUPPORT_ERRNO_H
