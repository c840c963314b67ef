// Next-token cross entropy fused with the LM head, in row chunks, so the [T, V] logits and
// their gradient never exist whole (a 152k-token vocabulary at 16 x 512 tokens would be
// 5 GB for each). Shape letters: src/core/shapes.h.
#pragma once
#include <torch/torch.h>

namespace mf {

// mean_n [ logsumexp_v(h_n . W_v) - h_n . W_{t_n} ] for hidden_TD, head_VD and targets_T.
// With gradients enabled, the forward pass also computes dL/dh and dL/dW chunk by chunk
// (the softmax of a chunk minus its one-hot, over T), so backward only scales them: the
// same FLOPs as logits + cross_entropy + backward, with peak memory of one chunk of logits.
// `chunk` rows at a time (<= 0: as many as keep a chunk's logits near 2^26 floats, 256 MB;
// fewer rows make skinny GEMMs and re-read dW per chunk, more hold more memory).
torch::Tensor fused_lm_loss(const torch::Tensor& hidden_TD, const torch::Tensor& head_VD,
                            const torch::Tensor& targets_T, int64_t chunk = 0);

}  // namespace mf
