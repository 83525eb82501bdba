#include "trainer/TokenLayout.h"

#include <functional>
#include <iterator>
#include <map>
#include <utility>

namespace bs {
namespace {

// Large but finite: exp() of it underflows to exactly 0 next to any real score, and adding a score to it
// cannot overflow to -inf, so a query with no allowed key gets a uniform row instead of NaN.
constexpr double kMaskedScore = -1e4;

torch::Tensor int64_tensor(const std::vector<int64_t>& v, const torch::Device& device) {
  auto t = torch::empty({static_cast<int64_t>(v.size())}, torch::kLong);
  std::copy(v.begin(), v.end(), t.data_ptr<int64_t>());
  return t.to(device);
}

// The sequences of a [B, L] batch, numbered in row-major order of their first token: packed, the tokens of a row
// with the same nonzero attention id; unpacked, all real tokens of a row (as attention_bias() masks them).
struct Sequences {
  std::vector<int64_t> of_position;        // [B*L]: the sequence of each position, -1 for padding
  std::vector<int64_t> index_in_sequence;  // [B*L]: the token's place in its sequence
  std::vector<int64_t> length;             // [sequences]
};

Sequences find_sequences(const torch::Tensor& attention_ids, bool packed) {
  const auto ids = attention_ids.to(torch::kCPU, torch::kLong).contiguous();
  const int64_t B = ids.size(0), L = ids.size(1);
  const int64_t* id = ids.data_ptr<int64_t>();
  Sequences s;
  s.of_position.assign(B * L, -1);
  s.index_in_sequence.assign(B * L, 0);
  std::vector<std::pair<int64_t, int64_t>> in_row;  // (attention id, sequence) of the row: a handful
  for (int64_t b = 0; b < B; ++b) {
    in_row.clear();
    for (int64_t p = b * L; p < (b + 1) * L; ++p) {
      if (id[p] == 0) continue;
      const int64_t key = packed ? id[p] : 1;
      auto it = std::find_if(in_row.begin(), in_row.end(), [&](const auto& e) { return e.first == key; });
      if (it == in_row.end()) {
        in_row.emplace_back(key, static_cast<int64_t>(s.length.size()));
        s.length.push_back(0);
        it = in_row.end() - 1;
      }
      s.of_position[p] = it->second;
      s.index_in_sequence[p] = s.length[it->second]++;
    }
  }
  return s;
}

// A group costs a fixed overhead besides its scores (its own matmuls, the contiguous copies of q, k and v, one
// more gradient accumulation in backward): on bert-mini bf16 (Zen 5) about as much as 600k score elements. A
// group that saves less than 1/8 of the padded score work joins the next longer one, as long as the joins add
// at most 1/8 of it in all; `count` (length -> sequences, longest first) and each sequence's group length
// change accordingly.
void merge_small_groups(std::map<int64_t, int64_t, std::greater<>>& count, std::vector<int64_t>& group_len,
                        int64_t padded_scores) {
  const int64_t limit = padded_scores / 8;
  int64_t added = 0;
  std::map<int64_t, int64_t> joins;  // length -> the longer length it joins
  // Only groups kept so far are joined into, so a join never chains.
  for (auto it = count.empty() ? count.end() : std::next(count.begin()); it != count.end();) {
    const auto longer = std::prev(it);
    const int64_t cost = it->second * (longer->first * longer->first - it->first * it->first);
    if (cost >= limit || added + cost > limit) {
      ++it;
      continue;
    }
    added += cost;
    longer->second += it->second;
    joins[it->first] = longer->first;
    it = count.erase(it);
  }
  for (auto& len : group_len) {
    if (const auto j = joins.find(len); j != joins.end()) len = j->second;
  }
}

}  // namespace

int64_t TokenLayout::attention_scores() const {
  if (!unpadded()) return rows * row_len * row_len;
  int64_t n = 0;
  for (const auto& g : groups) n += g.sequences * g.length * g.length;
  return n;
}

torch::Tensor attention_bias(const BertInputs& in, const torch::TensorOptions& options) {
  const auto& ids = in.attention_ids;
  const int64_t B = ids.size(0), L = ids.size(1);
  auto opts = options.device(ids.device());
  if (!in.packed) {
    return (ids == 0).to(opts).mul_(kMaskedScore).view({B, 1, 1, L});
  }
  auto same = ids.unsqueeze(2) == ids.unsqueeze(1);          // [B, L(query), L(key)]
  auto allowed = same.logical_and_(ids.ne(0).unsqueeze(1));  // the key is a real token
  return torch::zeros({B, 1, L, L}, opts).masked_fill_(allowed.logical_not().unsqueeze(1), kMaskedScore);
}

TokenLayout make_token_layout(const BertInputs& in, bool unpadded, const torch::TensorOptions& options) {
  TokenLayout layout;
  layout.rows = in.input_ids.size(0);
  layout.row_len = in.input_ids.size(1);
  const int64_t L = layout.row_len, padded_rows = layout.rows * L;
  if (unpadded) {
    const auto seq = find_sequences(in.attention_ids, in.packed);
    int64_t T = 0;
    for (int64_t n : seq.length) T += n;
    const int64_t g = unpad_row_granule(padded_rows), R = std::min(padded_rows, (T + g - 1) / g * g);
    if (T > 0 && (R < padded_rows || in.packed)) {  // else the padded layout is as small
      // Groups by length, longest first; each sequence's slots follow those of the earlier ones of its group.
      const int64_t q = attention_length_quantum(L);
      std::map<int64_t, int64_t, std::greater<>> count;  // group length -> sequences
      std::vector<int64_t> group_len(seq.length.size());
      for (std::size_t s = 0; s < seq.length.size(); ++s)
        count[group_len[s] = std::min(L, (seq.length[s] + q - 1) / q * q)]++;
      merge_small_groups(count, group_len, layout.rows * L * L);
      std::map<int64_t, int64_t> next_slot;
      for (const auto& [len, n] : count) {
        layout.groups.push_back({layout.slots, n, len});
        next_slot[len] = layout.slots;
        layout.slots += n * len;
      }
      std::vector<int64_t> first_slot(seq.length.size());
      for (std::size_t s = 0; s < seq.length.size(); ++s) {
        first_slot[s] = next_slot[group_len[s]];
        next_slot[group_len[s]] += group_len[s];
      }
      std::vector<int64_t> positions, slots;
      positions.reserve(R);
      slots.reserve(R);
      for (int64_t p = 0; p < padded_rows; ++p) {
        const int64_t s = seq.of_position[p];
        if (s < 0) continue;
        positions.push_back(p);
        slots.push_back(first_slot[s] + seq.index_in_sequence[p]);
      }
      const auto filled = int64_tensor(slots, torch::kCPU);
      positions.resize(R, positions.front());
      slots.resize(R, slots.front());
      const auto device = options.device();
      layout.real_rows = int64_tensor(positions, device);
      layout.slot_of_row = int64_tensor(slots, device);
      layout.real_tokens = T;
      layout.bias = torch::full({layout.slots}, kMaskedScore).index_fill_(0, filled, 0.0).to(options);
      return layout;
    }
  }
  layout.bias = attention_bias(in, options);
  return layout;
}

}  // namespace bs
