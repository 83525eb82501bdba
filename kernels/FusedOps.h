// Fused CPU operations of a BERT step, each an autograd Function with its own backward: one pass over memory
// where the operator-by-operator path makes three or four. float, double (for gradcheck) and bf16 tensors; bf16
// in and out with float arithmetic inside. Dropout masks come from Philox4x32-10 under a 64-bit key drawn from
// the default CPU generator per call, so a run whose generator state is restored (checkpoint resume)
// draws the same masks; backward reuses the forward's keep bits (1 bit per element).
#pragma once
#include <torch/torch.h>

namespace bs::kernels {

// gelu(x + bias) (erf form) over the last dimension; x [..., C], bias [C] or undefined. The matmul before it
// runs without its bias.
torch::Tensor bias_gelu(const torch::Tensor& x, const torch::Tensor& bias);

// LayerNorm(dropout(x + bias) + residual) over the last dimension, the post-LN residual block's tail.
// bias and residual may be undefined; p = 0 or !training: no dropout. Statistics in float.
torch::Tensor bias_dropout_add_layer_norm(const torch::Tensor& x, const torch::Tensor& bias,
                                          const torch::Tensor& residual, const torch::Tensor& gamma,
                                          const torch::Tensor& beta, double p, bool training, double eps);

// dropout(softmax(scores + key_bias)) over the last dimension: the attention probabilities of scores
// [sequences, ..., queries, keys] (already scaled by 1/sqrt(d)) with a per-key additive mask key_bias
// [sequences, keys] (no gradient). Softmax in float; backward from the saved softmax and keep bits.
torch::Tensor softmax_dropout(const torch::Tensor& scores, const torch::Tensor& key_bias, double p, bool training);

// Mean cross-entropy of logits [rows, classes] against class indices [rows]: log-softmax and NLL in one pass,
// float arithmetic on bf16 logits (no float copy of the logits), backward written straight into the logits'
// dtype. Returns a float scalar (double for double logits).
torch::Tensor cross_entropy(const torch::Tensor& logits, const torch::Tensor& labels);

// Inverted dropout with a Philox mask (identity when !training or p == 0).
torch::Tensor dropout(const torch::Tensor& x, double p, bool training);

// The variant this process runs ("avx512", "avx2", "scalar"), for logs and the environment table.
const char* kernel_isa();
// Whether fused kernels exist for this build and CPU (x86-64 with GCC/Clang; elsewhere `auto` means reference).
bool fused_available();

}  // namespace bs::kernels
