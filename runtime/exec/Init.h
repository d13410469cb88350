// Deterministic parameter initialization, identical under every strategy.
#ifndef PIPER_RUNTIME_EXEC_INIT_H
#define PIPER_RUNTIME_EXEC_INIT_H

#include <cstdint>
#include <string>

#include "proto/plan.pb.h"

namespace piper::runtime {

/// SplitMix64's output function: a bijective 64-bit mixer.
uint64_t mix64(uint64_t x);

/// FNV-1a, 64 bit, of the bytes of `s`.
uint64_t fnv1a64(const std::string &s);

/// The per-tensor RNG key of parameter `name` under `seed`.
uint64_t initKey(uint64_t seed, const std::string &name);

/// Element `index` of the standard normal sequence of key `key`: a pure
/// function of (key, index), so any slice can be generated on its own.
double standardNormal(uint64_t key, uint64_t index);

/// Fills `out[0..count)` with elements `first .. first+count-1` (flat,
/// row-major) of the tensor that `init` describes for parameter `name`.
/// Filling a shard with `first` = its offset gives exactly the slice of the
/// full tensor.
void fillInitializer(const plan::Initializer &init, const std::string &name,
                     uint64_t seed, int64_t first, float *out, int64_t count);

} // namespace piper::runtime

#endif // PIPER_RUNTIME_EXEC_INIT_H
