// Where the activation rows of the encoder sit in a [B, L] micro-batch, and how attention reads them.
//
// Padded, the activations are all B*L rows and attention runs on [B, heads, L, L] with the additive bias of
// attention_bias() (key padding, or block diagonal for packed rows). Unpadded (model.unpad), the activations are
// the T real tokens only, and attention runs per sequence: every sequence (a row, or one packed segment of a
// row) is placed in an attention group of sequences of about its length, so that a 40-token sequence costs a
// 48 x 48 score block, not 128 x 128, and packed segments never compute the scores between each other.
#pragma once
#include <torch/torch.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dataset/Batch.h"

namespace bs {

// Rows that unpadded activations are rounded up to (TokenLayout::real_rows): 64, or 1/16 of a small batch's
// padded rows, so that the rounding never costs more than 1/16 of the padded work.
inline int64_t unpad_row_granule(int64_t padded_rows) {
  return std::max<int64_t>(1, std::min<int64_t>(64, padded_rows / 16));
}

// Sequences of up to `length` tokens, attended as one [sequences, heads, length, length] block. Their tokens
// fill the attention slots [first_slot, first_slot + sequences * length), one row of `length` slots each,
// left-aligned; the rest of each row is empty (masked keys, queries never read).
struct AttentionGroup {
  int64_t first_slot = 0, sequences = 0, length = 0;
};

// A sequence of n tokens goes into the group of length min(L, n rounded up to attention_length_quantum(L)):
// L/8 (at least 8), so that there are at most 8 groups. A group that would save less than 1/8 of the padded
// score work joins the next longer one (a group has a fixed cost of its own; TokenLayout.cpp).
inline int64_t attention_length_quantum(int64_t row_len) { return std::max<int64_t>(8, (row_len + 7) / 8); }

struct TokenLayout {
  int64_t rows = 0, row_len = 0;
  // Padded: attention_bias(), [B,1,1,L] or [B,1,L,L]. Unpadded: [slots] over the attention slots, 0 where a
  // slot holds a token and a large negative where it is empty (view a group's part as [n,1,1,length]).
  torch::Tensor bias;
  // Unpadded: int64 [R], the flat positions (of B*L) of the T = real_tokens real tokens in row-major order,
  // then R - T copies of the first one: R is T rounded up to a multiple of unpad_row_granule(), so that the
  // activations come in few sizes (glibc's heap reuses freed blocks of recurring sizes; with a new T every step
  // it grew by ~0.8 GB in 60 bert-mini steps and page faults ate the gain). The copies' outputs are never read,
  // so they get zero gradients. Undefined: padded, the activations are all B*L rows.
  torch::Tensor real_rows;
  int64_t real_tokens = 0;
  // Unpadded: int64 [R], the attention slot of each activation row (the copies: the first row's slot).
  torch::Tensor slot_of_row;
  std::vector<AttentionGroup> groups;  // longest first; they tile [0, slots)
  int64_t slots = 0;

  bool unpadded() const { return real_rows.defined(); }
  // Score elements per head that attention computes: B*L*L padded, sum of sequences * length^2 unpadded.
  int64_t attention_scores() const;
};

// The layout of `in` on activations of dtype/device `options`. `unpadded` asks for the unpadded layout; it is
// taken when the batch has a real token and either padding to save or packed segments to separate, else the
// layout stays padded. Reads attention_ids on the host (hence model.unpad auto = off on CUDA).
TokenLayout make_token_layout(const BertInputs& in, bool unpadded, const torch::TensorOptions& options);

// Additive attention bias in `options`' dtype: 0 where a query may attend a key, a large negative elsewhere.
// Unpacked: [B,1,1,L] key-padding bias (attention_ids != 0). Packed: [B,1,L,L] block diagonal
// (same nonzero attention id). Finite, so fully masked (padding) queries never produce NaN.
torch::Tensor attention_bias(const BertInputs& in, const torch::TensorOptions& options);

}  // namespace bs
