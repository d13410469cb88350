// Cases of the moe GPU kernels (KernelCases.h): the router with ties and
// underflow, capacity slots with and without overflow (several warp chunks
// of the slot assignment), the per-expert linear, the load-balancing loss
// and the expert-parallel layout changes. Outputs start with random
// contents, so an element a GPU kernel forgets to write shows.
#include "runtime/hal/gpu/test/KernelCases.h"

#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

namespace piper::runtime::hal::testing {
namespace {

std::string dims(std::initializer_list<int64_t> ds) {
  std::string s;
  for (int64_t d : ds)
    s += (s.empty() ? "" : "x") + std::to_string(d);
  return s;
}

void routerCases(std::vector<KernelCase> &out) {
  // (N, E, k, norm_topk).
  for (auto [n, e, k, norm] : std::vector<std::tuple<int64_t, int64_t,
                                                      int64_t, int64_t>>{
           {1, 1, 1, 1},
           {7, 5, 2, 1},
           {33, 8, 2, 0},
           {64, 64, 6, 1},
           {5, 40, 40, 0},
           {100, 37, 3, 1},
           {20, 70, 8, 0},
           {128, 256, 8, 1}}) {
    std::string s = dims({n, e, k}) + " norm " + std::to_string(norm);
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"top_k", intAttr(k)}, {"norm_topk", intAttr(norm)}};
    out.push_back({"moe_router " + s,
                   "moe_router",
                   attrs,
                   {f32({n, e}, 2)},
                   {given(plan::I32, {n, k}, {-5}), f32({n, k})}});
    // Random indices may repeat within a row: the gradient adds them up.
    out.push_back({"moe_router_grad " + s,
                   "moe_router_grad",
                   attrs,
                   {f32({n, e}, 2), tokens({n, k}, e), f32({n, k})},
                   {f32({n, e})}});
  }
  // Exact ties go to the lower index; -1000 underflows p to exactly 0, so
  // those experts tie at 0 although their logits differ.
  for (int64_t norm : {0, 1}) {
    const std::vector<double> logits = {1, 1, 0, -1000, -1001, 0.5, 1, -1000,
                                        2, -1200, 2, 2, 0.5};
    for (int64_t k : {1, 3, 6}) {
      std::string s = "ties k " + std::to_string(k) + " norm " +
                      std::to_string(norm);
      std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
          {"top_k", intAttr(k)}, {"norm_topk", intAttr(norm)}};
      out.push_back({"moe_router " + s,
                     "moe_router",
                     attrs,
                     {given(plan::F32, {11, 8}, logits)},
                     {zeros({11, k}, plan::I32), zeros({11, k})}});
      out.push_back({"moe_router_grad " + s,
                     "moe_router_grad",
                     attrs,
                     {given(plan::F32, {11, 8}, logits), tokens({11, k}, 8),
                      f32({11, k})},
                     {zeros({11, 8})}});
    }
  }
}

void slotCases(std::vector<KernelCase> &out) {
  struct Shape {
    int64_t n, k, e, c, h;
    bool skewed; // every index 0 or 1: heavy overflow
  };
  // Chunks of the slot assignment hold 1024 assignments: 2800, 6000 and
  // 4096 span several. Overflow: (7,2,4,3) keeps 12 of 14; (700,4,8,300) drops
  // about 1/7; the skewed ones drop most.
  for (const Shape &sh : std::vector<Shape>{{1, 1, 1, 1, 1, false},
                                            {7, 2, 4, 3, 5, false},
                                            {50, 2, 8, 20, 33, false},
                                            {700, 4, 8, 300, 9, false},
                                            {3000, 2, 3, 2500, 3, false},
                                            {512, 8, 64, 80, 16, false},
                                            {300, 2, 4, 50, 7, true},
                                            {1100, 1, 2, 600, 2, true},
                                            {5, 2, 3, 2, 0, false}}) {
    const int64_t slots = sh.e * sh.c;
    std::string s = dims({sh.n, sh.k, sh.e, sh.c, sh.h}) +
                    (sh.skewed ? " skewed" : "");
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"experts", intAttr(sh.e)}, {"capacity", intAttr(sh.c)}};
    Operand indices = sh.skewed ? given(plan::I32, {sh.n, sh.k}, {0, 1, 0})
                                : tokens({sh.n, sh.k}, sh.e);
    out.push_back({"moe_dispatch " + s,
                   "moe_dispatch",
                   attrs,
                   {f32({sh.n, sh.h}), indices},
                   {f32({slots, sh.h})}});
    out.push_back({"moe_dispatch_grad " + s,
                   "moe_dispatch_grad",
                   attrs,
                   {indices, f32({slots, sh.h})},
                   {f32({sh.n, sh.h})}});
    out.push_back({"moe_combine " + s,
                   "moe_combine",
                   attrs,
                   {f32({slots, sh.h}), indices, positive({sh.n, sh.k})},
                   {f32({sh.n, sh.h})}});
    out.push_back({"moe_combine_grad " + s,
                   "moe_combine_grad",
                   attrs,
                   {f32({slots, sh.h}), indices, positive({sh.n, sh.k}),
                    f32({sh.n, sh.h})},
                   {f32({slots, sh.h}), f32({sh.n, sh.k})}});
  }
}

void expertLinearCases(std::vector<KernelCase> &out) {
  // (E, C, K, M); C = 0 leaves the buffers empty (dw is then zero).
  for (auto [e, c, k, m] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {1, 1, 1, 1}, {4, 3, 5, 7}, {8, 16, 33, 17}, {3, 0, 4, 5},
           {2, 37, 64, 129}}) {
    std::string s = dims({e, c, k, m});
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"experts", intAttr(e)}};
    // The GEMMs' summation order is the BLAS's: OpenBLAS on the CPU and in
    // the emulation, cuBLASLt on CUDA, which may differ by a few ulp of the
    // terms (up to 64 products of N(0,1) values): atol 1e-5 covers it.
    KernelCase fwd{"expert_linear " + s,
                   "expert_linear",
                   attrs,
                   {f32({e * c, k}), f32({e, k, m})},
                   {f32({e * c, m})}};
    KernelCase gin{"expert_linear_grad_input " + s,
                   "expert_linear_grad_input",
                   attrs,
                   {f32({e * c, m}), f32({e, k, m})},
                   {f32({e * c, k})}};
    KernelCase gw{"expert_linear_grad_weight " + s,
                  "expert_linear_grad_weight",
                  attrs,
                  {f32({e * c, k}), f32({e * c, m})},
                  {f32({e, k, m})}};
    for (KernelCase *kc : {&fwd, &gin, &gw}) {
      kc->atol = 1e-5;
      out.push_back(*kc);
    }
  }
}

void auxLossCases(std::vector<KernelCase> &out) {
  // (N, E, k): one token; more assignments than a chunk (3 x 1024).
  for (auto [n, e, k] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 1}, {9, 5, 2}, {64, 33, 4}, {1500, 8, 2}}) {
    std::string s = dims({n, e, k});
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"experts", intAttr(e)}, {"top_k", intAttr(k)}};
    out.push_back({"moe_aux_loss " + s,
                   "moe_aux_loss",
                   attrs,
                   {f32({n, e}, 2), tokens({n, k}, e)},
                   {f32({1})}});
    auto gradAttrs = attrs;
    gradAttrs.push_back({"scale", floatAttr(0.01)});
    out.push_back({"moe_aux_loss_grad " + s,
                   "moe_aux_loss_grad",
                   gradAttrs,
                   {f32({n, e}, 2), tokens({n, k}, e)},
                   {f32({n, e})}});
  }
}

void epCases(std::vector<KernelCase> &out) {
  // (N, k, E, C, G): capacity overflow, one member, one expert per member.
  for (auto [n, k, e, c, g] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t>>{
           {1, 1, 1, 1, 1},
           {30, 2, 4, 10, 2},
           {30, 2, 4, 5, 4},
           {600, 4, 8, 400, 1},
           {2000, 2, 6, 500, 3}}) {
    std::string s = dims({n, k, e, c, g});
    out.push_back({"moe_ep_counts " + s,
                   "moe_ep_counts",
                   {{"experts", intAttr(e)},
                    {"capacity", intAttr(c)},
                    {"members", intAttr(g)}},
                   {tokens({n, k}, e)},
                   {given(plan::I32, {g}, {-7}),
                    given(plan::I32, {e, 1}, {-7}),
                    given(plan::I32, {g}, {-7})}});
  }
  // (E, C, H, G): counts uniform in [0, C].
  for (auto [e, c, h, g] :
       std::vector<std::tuple<int64_t, int64_t, int64_t, int64_t>>{
           {1, 1, 1, 1}, {4, 3, 5, 2}, {8, 16, 33, 4}, {6, 40, 7, 3},
           {4, 3, 0, 2}}) {
    std::string s = dims({e, c, h, g});
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"experts", intAttr(e)}, {"capacity", intAttr(c)}};
    auto gatherAttrs = attrs;
    gatherAttrs.push_back({"members", intAttr(g)});
    for (const char *op : {"moe_ep_pack", "moe_ep_unpack"})
      out.push_back({std::string(op) + " " + s,
                     op,
                     attrs,
                     {f32({e * c, h}), tokens({e, 1}, c + 1)},
                     {f32({e * c, h})}});
    for (const char *op : {"moe_ep_gather", "moe_ep_scatter"})
      out.push_back({std::string(op) + " " + s,
                     op,
                     gatherAttrs,
                     {f32({e * c, h}), tokens({e, 1}, c + 1)},
                     {f32({e * c, h})}});
  }
  // Full counts: every slot moves.
  for (const char *op :
       {"moe_ep_pack", "moe_ep_unpack", "moe_ep_gather", "moe_ep_scatter"})
    out.push_back({std::string(op) + " full",
                   op,
                   {{"experts", intAttr(6)},
                    {"capacity", intAttr(5)},
                    {"members", intAttr(2)}},
                   {f32({30, 3}), given(plan::I32, {6, 1}, {5})},
                   {f32({30, 3})}});
}

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  routerCases(out);
  slotCases(out);
  expertLinearCases(out);
  auxLossCases(out);
  epCases(out);
  // Malformed calls, rejected by the shared checks with one message.
  KernelCase badBuf{"moe_dispatch buffer of the wrong shape",
                    "moe_dispatch",
                    {{"experts", intAttr(3)}, {"capacity", intAttr(2)}},
                    {f32({4, 5}), tokens({4, 2}, 3)},
                    {f32({5, 5})}};
  badBuf.rejects = "buf has shape [5,5]";
  out.push_back(badBuf);
  KernelCase badExperts{"expert_linear without experts",
                        "expert_linear",
                        {},
                        {f32({6, 4}), f32({3, 4, 5})},
                        {f32({6, 5})}};
  badExperts.rejects = "expert";
  out.push_back(badExperts);
  return out;
}

RegisterCases registered(cases());

} // namespace
} // namespace piper::runtime::hal::testing
