// Operand and attribute checks of the moe kernels (MoeKernels.cpp,
// MoeSlotKernels.cpp, MoeExpertKernels.cpp and MoeEpKernels.cpp), shared by
// the CPU kernels and the GPU kernels (runtime/hal/gpu): both backends accept
// and reject exactly the same calls, with the same messages. These checks never read tensor data; the checks
// that do (every index below the number of experts, every expert count in
// [0, capacity]) run in the CPU kernels only, after these, and the GPU
// kernels skip out-of-range indices and clamp counts instead (operands are
// device memory there).
#ifndef PIPER_RUNTIME_KERNELS_MOECHECKS_H
#define PIPER_RUNTIME_KERNELS_MOECHECKS_H

#include <cstdint>

#include "runtime/kernels/KernelUtil.h"

namespace piper::runtime::detail {

/// moe_router: logits [N,E] -> (indices [N,k] i32, weights [N,k]);
/// attributes top_k (1..E) and norm_topk (0 or 1, default 1).
Status checkMoeRouter(const KernelArgs &a, int64_t &rows, int64_t &experts,
                      int64_t &topK, bool &normTopK);
/// moe_router_grad: (logits [N,E], indices [N,k], dweights [N,k]) ->
/// dlogits [N,E]. The CPU kernel then checks indices < E.
Status checkMoeRouterGrad(const KernelArgs &a, int64_t &rows,
                          int64_t &experts, int64_t &topK, bool &normTopK);

/// The routing of N tokens to E experts of C slots each, and the width of
/// the rows moved (H).
struct MoeRouting {
  int64_t rows = 0;     // N
  int64_t topK = 0;     // k, the columns of indices
  int64_t experts = 0;  // E
  int64_t capacity = 0; // C
  int64_t slots = 0;    // E * C, the rows of a slot buffer
  int64_t hidden = 0;   // H
};

/// moe_dispatch: (x [N,H], indices [N,k]) -> buf [E*C,H].
Status checkMoeDispatch(const KernelArgs &a, MoeRouting &r);
/// moe_dispatch_grad: (indices [N,k], dbuf [E*C,H]) -> dx [N,H].
Status checkMoeDispatchGrad(const KernelArgs &a, MoeRouting &r);
/// moe_combine: (ebuf [E*C,H], indices [N,k], weights [N,k]) -> y [N,H].
Status checkMoeCombine(const KernelArgs &a, MoeRouting &r);
/// moe_combine_grad: (ebuf, indices, weights, dy [N,H]) ->
/// (debuf [E*C,H], dweights [N,k]).
Status checkMoeCombineGrad(const KernelArgs &a, MoeRouting &r);

/// The per-expert linear: E experts of capacity C, in -> out features.
struct ExpertLinearShape {
  int64_t experts = 0, capacity = 0, in = 0, out = 0;
};
/// expert_linear: (buf [E*C,K], w [E,K,M]) -> y [E*C,M].
Status checkExpertLinear(const KernelArgs &a, ExpertLinearShape &s);
/// expert_linear_grad_input: (dy [E*C,M], w [E,K,M]) -> dbuf [E*C,K].
Status checkExpertLinearGradInput(const KernelArgs &a, ExpertLinearShape &s);
/// expert_linear_grad_weight: (buf [E*C,K], dy [E*C,M]) -> dw [E,K,M].
Status checkExpertLinearGradWeight(const KernelArgs &a, ExpertLinearShape &s);

/// moe_aux_loss: (logits [N,E], indices [N,k]) -> loss (scalar); N >= 1.
/// The CPU kernel then checks indices < E.
Status checkMoeAuxLoss(const KernelArgs &a, int64_t &rows, int64_t &experts,
                       int64_t &topK);
/// moe_aux_loss_grad: (logits, indices) -> dlogits [N,E]; attribute scale
/// (default 1).
Status checkMoeAuxLossGrad(const KernelArgs &a, int64_t &rows,
                           int64_t &experts, int64_t &topK, double &scale);

/// Expert parallelism: E experts over G members, L = E / G each; slot
/// buffers of E * C rows.
struct EpShape {
  int64_t experts = 0, capacity = 0, members = 1, local = 0, rows = 0;
};
/// moe_ep_counts: indices [N,k] -> (send_counts [G], expert_counts [E,1],
/// expert_send_counts [G]), all i32. The CPU kernel then checks indices < E.
Status checkMoeEpCounts(const KernelArgs &a, EpShape &s, int64_t &rows,
                        int64_t &topK);
/// moe_ep_pack / moe_ep_unpack: (input [E*C,H], expert_counts [E,1]) ->
/// output [E*C,H]. The CPU kernel then checks each count in [0, C].
Status checkMoeEpPack(const KernelArgs &a, EpShape &s, int64_t &hidden);
/// moe_ep_gather / moe_ep_scatter: (input [E*C,H], counts [G*L,1]) ->
/// output [E*C,H]; attribute members. The CPU kernel then checks each count
/// in [0, C].
Status checkMoeEpGather(const KernelArgs &a, EpShape &s, int64_t &hidden);

} // namespace piper::runtime::detail

#endif // PIPER_RUNTIME_KERNELS_MOECHECKS_H
