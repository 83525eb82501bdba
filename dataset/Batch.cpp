#include "dataset/Batch.h"

#include <algorithm>

namespace bs {

int64_t MicroBatch::samples() const {
  int64_t n = 0;
  for (const auto& r : rows) n += static_cast<int64_t>(r.size());
  return n;
}

BertBatch collate(const ShardData& data, const MicroBatch& mb, int64_t row_len) {
  const auto* len = data.lengths.data_ptr<int32_t>();
  const int64_t S = data.seq_len(), P = data.max_predictions();
  int64_t L = row_len;
  if (L <= 0) {
    for (const auto& row : mb.rows) {
      int64_t used = 0;
      for (int64_t i : row) used += len[i];
      L = std::max(L, used);
    }
  }
  const int64_t B = static_cast<int64_t>(mb.rows.size());
  auto ids = torch::zeros({B, L}, torch::kInt64), seg = torch::zeros({B, L}, torch::kInt64),
       pos = torch::zeros({B, L}, torch::kInt64), att = torch::zeros({B, L}, torch::kInt64);
  auto* pid = ids.data_ptr<int64_t>();
  auto* pseg = seg.data_ptr<int64_t>();
  auto* ppos = pos.data_ptr<int64_t>();
  auto* patt = att.data_ptr<int64_t>();
  const auto* sid = data.input_ids.data_ptr<int32_t>();
  const auto* sseg = data.segment_ids.data_ptr<int32_t>();
  const auto* mpos = data.masked_lm_positions.data_ptr<int32_t>();
  const auto* mids = data.masked_lm_ids.data_ptr<int32_t>();
  const auto* nsp = data.next_sentence_labels.data_ptr<int32_t>();
  std::vector<int64_t> mlm_pos, mlm_lab, nsp_pos, nsp_lab;
  BertBatch b;
  bool packed = false;
  for (int64_t r = 0; r < B; ++r) {
    const auto& row = mb.rows[r];
    packed = packed || row.size() > 1;
    int64_t off = 0, seq_no = 0;
    for (int64_t i : row) {
      const int64_t n = len[i];
      if (off + n > L)
        throw DataError("collate: row of " + std::to_string(off + n) + " tokens exceeds row length " +
                        std::to_string(L));
      ++seq_no;
      for (int64_t t = 0; t < n; ++t) {
        const int64_t k = r * L + off + t;
        pid[k] = sid[i * S + t];
        pseg[k] = sseg[i * S + t];
        ppos[k] = t;
        patt[k] = seq_no;
      }
      // MLPerf pads masked_lm_positions with 0 (the [CLS] slot): a 0 position ends the list.
      for (int64_t p = 0; p < P; ++p) {
        const int64_t at = mpos[i * P + p];
        if (at <= 0 || at >= n) break;
        mlm_pos.push_back(r * L + off + at);
        mlm_lab.push_back(mids[i * P + p]);
      }
      nsp_pos.push_back(r * L + off);
      nsp_lab.push_back(nsp[i]);
      off += n;
      b.real_tokens += n;
      ++b.samples;
    }
  }
  auto vec = [](const std::vector<int64_t>& v) {
    return torch::from_blob(const_cast<int64_t*>(v.data()), {static_cast<int64_t>(v.size())}, torch::kInt64).clone();
  };
  b.inputs.input_ids = ids;
  b.inputs.segment_ids = seg;
  b.inputs.position_ids = pos;
  b.inputs.attention_ids = att;
  b.inputs.packed = packed;
  b.inputs.mlm_positions = vec(mlm_pos);
  b.inputs.nsp_positions = vec(nsp_pos);
  b.mlm_labels = vec(mlm_lab);
  b.nsp_labels = vec(nsp_lab);
  b.computed_tokens = B * L;
  return b;
}

BertBatch to_device(const BertBatch& b, torch::Device device) {
  if (device.is_cpu()) return b;
  auto move = [&](const torch::Tensor& t) { return t.pin_memory().to(device, /*non_blocking=*/true); };
  BertBatch out = b;
  out.inputs.input_ids = move(b.inputs.input_ids);
  out.inputs.segment_ids = move(b.inputs.segment_ids);
  out.inputs.position_ids = move(b.inputs.position_ids);
  out.inputs.attention_ids = move(b.inputs.attention_ids);
  out.inputs.mlm_positions = move(b.inputs.mlm_positions);
  out.inputs.nsp_positions = move(b.inputs.nsp_positions);
  out.mlm_labels = move(b.mlm_labels);
  out.nsp_labels = move(b.nsp_labels);
  return out;
}

}  // namespace bs
