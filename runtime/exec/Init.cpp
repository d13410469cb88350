// Counter-based parameter initialization: splitmix64 of (seed, name, index),
// two uniforms, Box-Muller.
#include "runtime/exec/Init.h"

#include <cmath>

namespace piper::runtime {

namespace {
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
constexpr double kTwoPi = 6.283185307179586476925286766559;
} // namespace

uint64_t mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fnv1a64(const std::string &s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001B3ull;
  }
  return h;
}

uint64_t initKey(uint64_t seed, const std::string &name) {
  return mix64(fnv1a64(name) ^ mix64(seed + kGolden));
}

double standardNormal(uint64_t key, uint64_t index) {
  // Counters 2i and 2i+1 give the two uniforms of element i; using one normal
  // per element (not both Box-Muller outputs) keeps every element independent
  // of its neighbours, which is what makes shards exact slices.
  uint64_t r1 = mix64(key + (2 * index + 1) * kGolden);
  uint64_t r2 = mix64(key + (2 * index + 2) * kGolden);
  double u1 = (static_cast<double>(r1 >> 11) + 0.5) * 0x1p-53; // (0, 1)
  double u2 = static_cast<double>(r2 >> 11) * 0x1p-53;         // [0, 1)
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
}

void fillInitializer(const plan::Initializer &init, const std::string &name,
                     uint64_t seed, int64_t first, float *out, int64_t count) {
  switch (init.kind()) {
  case plan::Initializer::ONES:
    for (int64_t i = 0; i < count; ++i)
      out[i] = 1.0f;
    return;
  case plan::Initializer::NORMAL: {
    uint64_t key = initKey(seed, name);
    for (int64_t i = 0; i < count; ++i)
      out[i] = static_cast<float>(
          init.scale() * standardNormal(key, static_cast<uint64_t>(first + i)));
    return;
  }
  default:
    for (int64_t i = 0; i < count; ++i)
      out[i] = 0.0f;
    return;
  }
}

} // namespace piper::runtime
