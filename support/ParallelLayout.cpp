#include "support/ParallelLayout.h"

#include <algorithm>

namespace piper {

const char *axisName(Axis axis) {
  switch (axis) {
  case Axis::pp:
    return "pp";
  case Axis::dp:
    return "dp";
  case Axis::cp:
    return "cp";
  case Axis::tp:
    return "tp";
  case Axis::ep:
    return "ep";
  case Axis::dpcp:
    return "dp-cp";
  case Axis::edp:
    return "edp";
  }
  return "?";
}

std::string ParallelLayout::check(const Degrees &d, int64_t maxWorld) {
  const std::pair<const char *, int64_t> all[] = {
      {"pp", d.pp}, {"dp", d.dp}, {"cp", d.cp}, {"tp", d.tp}, {"ep", d.ep}};
  for (auto [name, v] : all)
    if (v < 1)
      return std::string(name) + " must be at least 1, got " +
             std::to_string(v);
  int64_t world = 1;
  for (int64_t v : {d.pp, d.dp, d.cp, d.tp}) {
    if (v > maxWorld / world)
      return "pp " + std::to_string(d.pp) + " x dp " + std::to_string(d.dp) +
             " x cp " + std::to_string(d.cp) + " x tp " + std::to_string(d.tp) +
             " exceeds the " + std::to_string(maxWorld) + " ranks of a world";
    world *= v;
  }
  if ((d.dp * d.cp) % d.ep != 0)
    return "ep " + std::to_string(d.ep) +
           " does not divide the gradient replicas of a stage (dp " +
           std::to_string(d.dp) + " x cp " + std::to_string(d.cp) + ")";
  return "";
}

ParallelLayout::ParallelLayout(const Degrees &d) : d_(d) {
  for (int64_t *v : {&d_.pp, &d_.dp, &d_.cp, &d_.tp, &d_.ep})
    *v = std::max<int64_t>(1, *v);
}

int64_t ParallelLayout::size(Axis axis) const {
  switch (axis) {
  case Axis::pp:
    return d_.pp;
  case Axis::dp:
    return d_.dp;
  case Axis::cp:
    return d_.cp;
  case Axis::tp:
    return d_.tp;
  case Axis::ep:
    return d_.ep;
  case Axis::dpcp:
    return d_.dp * d_.cp;
  case Axis::edp:
    return d_.dp * d_.cp / d_.ep;
  }
  return 1;
}

int64_t ParallelLayout::stride(Axis axis) const {
  switch (axis) {
  case Axis::pp:
    return stageSize();
  case Axis::dp:
    return d_.cp * d_.tp;
  case Axis::cp:
  case Axis::ep:
  case Axis::dpcp:
    return d_.tp;
  case Axis::tp:
    return 1;
  case Axis::edp:
    return d_.tp * d_.ep;
  }
  return 1;
}

int64_t ParallelLayout::member(Axis axis, int64_t rank) const {
  return rank / stride(axis) % size(axis);
}

Coords ParallelLayout::coords(int64_t rank) const {
  return Coords{member(Axis::pp, rank), member(Axis::dp, rank),
                member(Axis::cp, rank), member(Axis::tp, rank)};
}

int64_t ParallelLayout::rank(const Coords &c) const {
  return ((c.pp * d_.dp + c.dp) * d_.cp + c.cp) * d_.tp + c.tp;
}

std::vector<int64_t> ParallelLayout::group(Axis axis, int64_t rank) const {
  int64_t s = stride(axis), first = rank - member(axis, rank) * s;
  std::vector<int64_t> ranks;
  for (int64_t m = 0; m < size(axis); ++m)
    ranks.push_back(first + m * s);
  return ranks;
}

std::vector<std::vector<int64_t>> ParallelLayout::groups(Axis axis) const {
  std::vector<std::vector<int64_t>> all;
  for (int64_t r = 0; r < worldSize(); ++r)
    if (member(axis, r) == 0)
      all.push_back(group(axis, r));
  return all;
}

std::vector<int64_t> ParallelLayout::slice(Axis axis, int64_t m) const {
  // Blocks of `stride` consecutive ranks, one in every `size` of them.
  int64_t s = stride(axis), period = s * size(axis);
  std::vector<int64_t> ranks;
  for (int64_t hi = 0; hi < worldSize() / period; ++hi)
    for (int64_t lo = 0; lo < s; ++lo)
      ranks.push_back(hi * period + m * s + lo);
  return ranks;
}

std::string ParallelLayout::str() const {
  return "pp=" + std::to_string(d_.pp) + " dp=" + std::to_string(d_.dp) +
         " cp=" + std::to_string(d_.cp) + " tp=" + std::to_string(d_.tp) +
         " ep=" + std::to_string(d_.ep);
}

} // namespace piper
