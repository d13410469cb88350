// Cases of the attention GPU kernels (KernelCases.h): causal attention and
// its gradient over sequences of one token, odd and longer lengths,
// grouped-query groups of 1, 2, 4 and 8, head dims below, at and beyond a
// warp (8 to 256, 48 and 10 not multiples of 32), sequences of one to
// five blocks of 32 keys, with and without rotary embeddings.
#include "runtime/hal/gpu/test/KernelCases.h"

#include <cmath>
#include <tuple>

namespace piper::runtime::hal::testing {
namespace {

std::vector<KernelCase> cases() {
  std::vector<KernelCase> out;
  // batch, seq, heads, kv_heads, head dim, rope_theta.
  using Config =
      std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, double>;
  for (auto [batch, seq, heads, kvHeads, hd, theta] : std::vector<Config>{
           {1, 1, 1, 1, 8, 0.0},
           {2, 1, 2, 1, 8, 10000.0},
           {2, 5, 2, 2, 8, 10000.0},
           {1, 7, 4, 2, 16, 0.0},
           {2, 9, 4, 1, 16, 10000.0},
           {3, 4, 2, 1, 48, 10000.0},
           {2, 3, 6, 3, 10, 0.0},
           {1, 17, 2, 2, 64, 0.0},
           {1, 33, 8, 2, 64, 500000.0},
           {1, 40, 8, 1, 32, 10000.0},
           {1, 6, 1, 1, 256, 10000.0},
           // Several blocks of 32 keys (queries), full and partial; the
           // small ones (up to 3600 operand elements) also run with 32
           // lanes (gpu_kernels_lanes_test).
           {1, 40, 2, 1, 12, 10000.0},
           {1, 66, 1, 1, 10, 0.0},
           // Rows read as float4 with one and two vectors per lane, also
           // with 32 lanes.
           {1, 5, 1, 1, 128, 10000.0},
           {1, 2, 1, 1, 256, 0.0},
           {2, 100, 4, 2, 64, 10000.0},
           {1, 129, 4, 1, 48, 0.0},
           {1, 65, 2, 2, 256, 10000.0},
       }) {
    int64_t rows = batch * seq, qCols = heads * hd;
    int64_t cols = (heads + 2 * kvHeads) * hd;
    std::string name = "b" + std::to_string(batch) + " s" +
                       std::to_string(seq) + " h" + std::to_string(heads) +
                       "/" + std::to_string(kvHeads) + " hd" +
                       std::to_string(hd) + (theta != 0 ? " rope" : "");
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"heads", intAttr(heads)},
        {"kv_heads", intAttr(kvHeads)},
        {"seq", intAttr(seq)}};
    if (theta != 0)
      attrs.push_back({"rope_theta", floatAttr(theta)});
    // The forward holds the default bounds (1e-5 relative, 1e-6 absolute)
    // although the CPU takes exp with its own vectorized polynomial
    // (VecMath.h's fastExp) and sums over a stored probability matrix with
    // BLAS where the GPU kernels sum online.
    // lse (each row's log-sum-exp, as a bf16 pair per head) too.
    out.push_back({"attention " + name,
                   "attention",
                   attrs,
                   {f32({rows, cols})},
                   {zeros({rows, qCols}), lsePairs(rows, heads)}});
    // The gradient's dK and dV rows sum group * (seq - j) terms P_ij dy_i
    // (and dS_ij q_i) of magnitude ~1 in float, in another order on each
    // side (the CPU's GEMMs head by head, the GPU kernels query by query),
    // down to results near 0 (N(0, 1) dy cancels): each side's rounding is
    // ~1e-7 of the terms' absolute sum, a few 1e-6 at seq 40 with a group
    // of 8. Hence 1e-5 absolute.
    // y and lse (inputs 1, 2) are read by the fused kernels only: these
    // (SIMT) kernels recompute the softmax, as the CPU's.
    KernelCase backward{"attention_grad " + name,
                        "attention_grad",
                        attrs,
                        {f32({rows, cols}), f32({rows, qCols}),
                         f32({rows, 2 * heads}), f32({rows, qCols})},
                        {f32({rows, cols})}};
    backward.atol = 1e-5;
    out.push_back(backward);
  }
  // Llama 3.1's rescaled rotary frequencies (rope_factor & co.): with head
  // dim 32, theta 5e5 and an original context of 64, the 16 frequencies
  // fall in all three ranges (kept, interpolated, divided by the factor).
  {
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"heads", intAttr(4)},
        {"kv_heads", intAttr(2)},
        {"seq", intAttr(40)},
        {"rope_theta", floatAttr(500000.0)},
        {"rope_factor", floatAttr(8.0)},
        {"rope_low_freq_factor", floatAttr(1.0)},
        {"rope_high_freq_factor", floatAttr(4.0)},
        {"rope_original_max_position", intAttr(64)}};
    const int64_t rows = 2 * 40, qCols = 4 * 32, cols = (4 + 2 * 2) * 32;
    out.push_back({"attention b2 s40 h4/2 hd32 rope llama3",
                   "attention",
                   attrs,
                   {f32({rows, cols})},
                   {zeros({rows, qCols}), lsePairs(rows, 4)}});
    KernelCase backward{"attention_grad b2 s40 h4/2 hd32 rope llama3",
                        "attention_grad",
                        attrs,
                        {f32({rows, cols}), f32({rows, qCols}),
                         f32({rows, 2 * 4}), f32({rows, qCols})},
                        {f32({rows, cols})}};
    backward.atol = 1e-5; // as above
    out.push_back(backward);
  }
  // Ring attention steps (context parallelism): batch, whole sequence, cp,
  // member, step, heads, kv_heads, head dim, rope_theta. Steps after 0
  // combine with a given o and lse (forward) or add to given dq and dkv
  // (backward); a member's first chunk sees nothing of a later owner's
  // shard (lse -inf, o kept); local rows of one to five blocks of 32.
  using RingConfig = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t,
                                int64_t, int64_t, int64_t, double>;
  for (auto [batch, seq, cp, member, step, heads, kvHeads, hd, theta] :
       std::vector<RingConfig>{
           {1, 8, 2, 0, 0, 2, 1, 8, 10000.0},
           {2, 8, 2, 0, 1, 2, 2, 8, 0.0},
           {2, 8, 2, 1, 1, 2, 1, 8, 10000.0},
           {1, 16, 4, 2, 3, 4, 2, 16, 10000.0},
           {1, 16, 4, 3, 1, 4, 1, 12, 0.0},
           {2, 12, 1, 0, 0, 2, 1, 8, 10000.0},
           {1, 256, 2, 1, 1, 2, 1, 64, 10000.0},
           {1, 264, 2, 0, 1, 1, 1, 10, 0.0},
           {1, 64, 2, 1, 0, 4, 2, 32, 500000.0},
       }) {
    int64_t local = seq / cp, rows = batch * local, qCols = heads * hd;
    int64_t kvWidth = 2 * kvHeads * hd, cols = qCols + kvWidth;
    std::string name = "b" + std::to_string(batch) + " s" +
                       std::to_string(seq) + " cp" + std::to_string(cp) + " m" +
                       std::to_string(member) + " step" + std::to_string(step) +
                       " h" + std::to_string(heads) + "/" +
                       std::to_string(kvHeads) + " hd" + std::to_string(hd) +
                       (theta != 0 ? " rope" : "");
    std::vector<std::pair<std::string, plan::AttrValue>> attrs = {
        {"heads", intAttr(heads)},
        {"kv_heads", intAttr(kvHeads)},
        {"seq", intAttr(seq)},
        {"cp", intAttr(cp)},
        {"step", intAttr(step)}};
    if (theta != 0)
      attrs.push_back({"rope_theta", floatAttr(theta)});
    KernelCase forward{"attention_block " + name,
                       "attention_block",
                       attrs,
                       {f32({rows, cols}), f32({rows, kvWidth})},
                       {zeros({rows, qCols}), lsePairs(rows, heads)}};
    if (step > 0) {
      // The log-sum-exp pair (hi, lo) of each head.
      forward.inputs.push_back(f32({rows, qCols}));
      forward.inputs.push_back(f32({rows, 2 * heads}));
    }
    forward.contextMember = member;
    out.push_back(forward);
    // lse = log(local rows) (the pair: hi, then lo = 0 per head): P =
    // exp(s - lse) of the size a softmax over the shard gives; the bound
    // is attention_grad's.
    std::vector<double> lsePair(2 * heads, 0.0);
    std::fill(lsePair.begin(), lsePair.begin() + heads,
              std::log(double(local)));
    KernelCase backward{
        "attention_block_grad " + name,
        "attention_block_grad",
        attrs,
        {f32({rows, cols}), f32({rows, kvWidth}), f32({rows, qCols}),
         given(plan::F32, {rows, 2 * heads}, lsePair), f32({rows, qCols})},
        {f32({rows, qCols}), f32({rows, kvWidth})}};
    if (step > 0) {
      backward.inputs.push_back(f32({rows, qCols}));
      backward.inputs.push_back(f32({rows, kvWidth}));
    }
    backward.contextMember = member;
    backward.atol = 1e-5;
    out.push_back(backward);
  }
  KernelCase badStep{"attention_block step past cp",
                     "attention_block",
                     {{"heads", intAttr(2)},
                      {"seq", intAttr(8)},
                      {"cp", intAttr(2)},
                      {"step", intAttr(2)}},
                     {f32({8, 12}), f32({8, 8})},
                     {zeros({8, 4}), zeros({8, 4})}};
  badStep.rejects = "step";
  out.push_back(badStep);
  // Malformed calls, rejected by the shared checks with one message.
  KernelCase badHeads{
      "attention kv_heads not dividing heads",
      "attention",
      {{"heads", intAttr(4)}, {"kv_heads", intAttr(3)}, {"seq", intAttr(4)}},
      {f32({8, 10 * 8})},
      {zeros({8, 32}), zeros({8, 8})}};
  badHeads.rejects = "kv_heads";
  out.push_back(badHeads);
  KernelCase badRows{
      "attention_grad rows not a multiple of seq",
      "attention_grad",
      {{"heads", intAttr(2)}, {"kv_heads", intAttr(2)}, {"seq", intAttr(4)}},
      {f32({6, 6 * 8}), f32({6, 16}), f32({6, 4}), f32({6, 16})},
      {f32({6, 6 * 8})}};
  badRows.rejects = "seq";
  out.push_back(badRows);
  return out;
}

RegisterCases registered(cases());

} // namespace
} // namespace piper::runtime::hal::testing
