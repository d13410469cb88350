#include "support/ParallelLayout.h"

#include <algorithm>
#include <set>

#include <catch2/catch.hpp>

using namespace piper;

namespace {

/// Every layout of at most `maxWorld` ranks.
std::vector<Degrees> allLayouts(int64_t maxWorld) {
  std::vector<Degrees> all;
  for (int64_t pp = 1; pp <= maxWorld; ++pp)
    for (int64_t dp = 1; pp * dp <= maxWorld; ++dp)
      for (int64_t cp = 1; pp * dp * cp <= maxWorld; ++cp)
        for (int64_t tp = 1; pp * dp * cp * tp <= maxWorld; ++tp)
          for (int64_t ep = 1; ep <= dp * cp; ++ep)
            if ((dp * cp) % ep == 0)
              all.push_back(Degrees{pp, dp, cp, tp, ep});
  return all;
}

const Axis kAxes[] = {Axis::pp, Axis::dp,   Axis::cp, Axis::tp,
                      Axis::ep, Axis::dpcp, Axis::edp};

} // namespace

TEST_CASE("ParallelLayout: coordinates, groups and slices of every layout "
          "up to 64 ranks",
          "[layout]") {
  for (const Degrees &d : allLayouts(64)) {
    CAPTURE(ParallelLayout(d).str());
    REQUIRE(ParallelLayout::check(d, 64).empty());
    ParallelLayout l(d);
    REQUIRE(l.worldSize() == d.pp * d.dp * d.cp * d.tp);
    for (int64_t r = 0; r < l.worldSize(); ++r) {
      Coords c = l.coords(r);
      REQUIRE(l.rank(c) == r);
      // The order written out: tp innermost, then cp, dp, pp.
      REQUIRE(r == ((c.pp * d.dp + c.dp) * d.cp + c.cp) * d.tp + c.tp);
      REQUIRE(l.member(Axis::dpcp, r) == c.dp * d.cp + c.cp);
      REQUIRE(l.member(Axis::ep, r) == (c.dp * d.cp + c.cp) % d.ep);
      REQUIRE(l.member(Axis::edp, r) == (c.dp * d.cp + c.cp) / d.ep);
    }
    for (Axis axis : kAxes) {
      CAPTURE(axisName(axis));
      std::vector<std::vector<int64_t>> groups = l.groups(axis);
      REQUIRE(int64_t(groups.size()) * l.size(axis) == l.worldSize());
      std::set<int64_t> seen;
      for (const std::vector<int64_t> &g : groups) {
        REQUIRE(int64_t(g.size()) == l.size(axis));
        for (size_t m = 0; m < g.size(); ++m) {
          REQUIRE(seen.insert(g[m]).second);
          REQUIRE(l.member(axis, g[m]) == int64_t(m));
          REQUIRE(l.group(axis, g[m]) == g);
          // Members of a group differ only on their axis: the same pipeline
          // stage and tensor member, except on those axes themselves.
          Coords a = l.coords(g[0]), b = l.coords(g[m]);
          if (axis != Axis::pp)
            REQUIRE(a.pp == b.pp);
          if (axis != Axis::tp)
            REQUIRE(a.tp == b.tp);
          if (axis == Axis::tp || axis == Axis::dp)
            REQUIRE(a.cp == b.cp);
          if (axis == Axis::tp || axis == Axis::cp)
            REQUIRE(a.dp == b.dp);
        }
      }
      REQUIRE(int64_t(seen.size()) == l.worldSize());
    }
    // An expert group is a block of consecutive members of a gradient group.
    for (int64_t r = 0; r < l.worldSize(); ++r) {
      std::vector<int64_t> e = l.group(Axis::ep, r), g = l.group(Axis::dpcp, r);
      auto at = std::search(g.begin(), g.end(), e.begin(), e.end());
      REQUIRE(at != g.end());
      REQUIRE((at - g.begin()) % d.ep == 0);
      // An expert data group: every ep-th member of the gradient group,
      // from the rank's place in its ep group.
      std::vector<int64_t> x = l.group(Axis::edp, r), want;
      for (size_t m = l.member(Axis::ep, r); m < g.size(); m += d.ep)
        want.push_back(g[m]);
      REQUIRE(x == want);
    }
    // A slice: the ranks of one coordinate of an axis, increasing.
    for (Axis axis : kAxes)
      for (int64_t m = 0; m < l.size(axis); ++m) {
        std::vector<int64_t> want;
        for (int64_t r = 0; r < l.worldSize(); ++r)
          if (l.member(axis, r) == m)
            want.push_back(r);
        REQUIRE(l.slice(axis, m) == want);
      }
    // A stage group: the ranks of one pipeline coordinate, consecutive.
    for (int64_t s = 0; s < d.pp; ++s) {
      std::vector<int64_t> ranks = l.slice(Axis::pp, s);
      REQUIRE(int64_t(ranks.size()) == l.stageSize());
      REQUIRE(ranks.front() == s * l.stageSize());
      REQUIRE(ranks.back() == (s + 1) * l.stageSize() - 1);
    }
  }
}

TEST_CASE("ParallelLayout: the groups of pp2 dp2 cp2 tp2 ep2, written out",
          "[layout]") {
  ParallelLayout l(Degrees{2, 2, 2, 2, 2});
  using G = std::vector<std::vector<int64_t>>;
  CHECK(l.groups(Axis::tp)[0] == std::vector<int64_t>{0, 1});
  CHECK(
      l.groups(Axis::cp) ==
      G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(
      l.groups(Axis::dp) ==
      G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(l.groups(Axis::dpcp) ==
        G{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}});
  CHECK(
      l.groups(Axis::ep) ==
      G{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}});
  CHECK(
      l.groups(Axis::edp) ==
      G{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}});
  CHECK(l.groups(Axis::pp)[0] == std::vector<int64_t>{0, 8});
  CHECK(l.slice(Axis::pp, 1).front() == 8);
  CHECK(l.str() == "pp=2 dp=2 cp=2 tp=2 ep=2");
}

TEST_CASE("ParallelLayout::check names what is wrong", "[layout]") {
  CHECK(ParallelLayout::check(Degrees{1, 0, 1, 1, 1}, 64) ==
        "dp must be at least 1, got 0");
  CHECK(ParallelLayout::check(Degrees{1, 1, 1, -2, 1}, 64) ==
        "tp must be at least 1, got -2");
  CHECK(ParallelLayout::check(Degrees{1, 3, 1, 1, 2}, 64) ==
        "ep 2 does not divide the gradient replicas of a stage (dp 3 x cp 1)");
  CHECK(ParallelLayout::check(Degrees{4, 4, 2, 4, 1}, 64) ==
        "pp 4 x dp 4 x cp 2 x tp 4 exceeds the 64 ranks of a world");
  // No overflow on huge degrees.
  CHECK(!ParallelLayout::check(
             Degrees{int64_t(1) << 40, int64_t(1) << 40, 1, 1, 1}, int64_t(1)
                                                                       << 20)
             .empty());
  CHECK(ParallelLayout::check(Degrees{2, 4, 2, 4, 8}, 64).empty());
}
