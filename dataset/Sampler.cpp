#include "dataset/Sampler.h"

#include <algorithm>
#include <numeric>
#include <stdexcept>

#include "common/Choices.h"
#include "common/Errors.h"

namespace bs {
namespace {

// splitmix64: a tiny, fully specified generator, so permutations do not depend on the standard library.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, bound) by rejection (no modulo bias).
  uint64_t below(uint64_t bound) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do x = next();
    while (x >= limit);
    return x % bound;
  }
};

using Samples = std::vector<int64_t>;

// Longest first; ties by index so every rank orders identically.
void sort_longest_first(Samples& s, const std::vector<int32_t>& len) {
  std::sort(s.begin(), s.end(), [&](int64_t a, int64_t b) { return len[a] != len[b] ? len[a] > len[b] : a < b; });
}

// Deals sorted samples over `parts` ranks in snake order (0..p-1, p-1..0, ...): near-equal work per rank.
std::vector<Samples> snake_deal(const Samples& sorted, int64_t parts) {
  std::vector<Samples> out(parts);
  for (size_t i = 0; i < sorted.size(); ++i) {
    int64_t round = int64_t(i) / parts, pos = int64_t(i) % parts;
    out[round % 2 == 0 ? pos : parts - 1 - pos].push_back(sorted[i]);
  }
  return out;
}

std::vector<MicroBatch> chunk_single_rows(const Samples& s, int64_t micro) {
  std::vector<MicroBatch> out;
  for (size_t i = 0; i < s.size(); i += micro) {
    MicroBatch mb;
    for (size_t j = i; j < std::min(s.size(), i + size_t(micro)); ++j) mb.rows.push_back({s[j]});
    out.push_back(std::move(mb));
  }
  return out;
}

// The shared skeleton: per-epoch permutation, step cutting, position bookkeeping. Subclasses say how one
// step's global samples become this rank's micro-batches.
class SamplerBase : public BatchSampler {
 public:
  SamplerBase(const SamplerOptions& opt, const std::vector<int32_t>& lengths) : opt_(opt), len_(lengths) {
    const int64_t n = int64_t(lengths.size());
    steps_per_epoch_ = opt.global_batch > 0 ? n / opt.global_batch : 0;
    if (steps_per_epoch_ == 0)
      throw std::invalid_argument("sampler: " + std::to_string(n) +
                                  " training samples are fewer than one global "
                                  "batch (batch.global=" +
                                  std::to_string(opt.global_batch) + "); lower batch.global or prepare more data");
  }

  std::vector<MicroBatch> next_step() override {
    const int64_t e = position_ / steps_per_epoch_, s = position_ % steps_per_epoch_;
    if (e != cached_epoch_) {
      perm_ = epoch_permutation(int64_t(len_.size()), opt_.seed, e);
      perm_.resize(steps_per_epoch_ * opt_.global_batch);  // drop the incomplete tail batch
      prepare_epoch(perm_);
      cached_epoch_ = e;
    }
    ++position_;
    return rank_step(s);
  }
  int64_t epoch() const override { return position_ / steps_per_epoch_; }
  int64_t position() const override { return position_; }
  void seek(int64_t steps) override {
    if (steps < 0) throw std::invalid_argument("sampler: seek to a negative step " + std::to_string(steps));
    position_ = steps;
  }
  int64_t steps_per_epoch() const override { return steps_per_epoch_; }

 protected:
  int64_t local_batch() const { return opt_.global_batch / opt_.world; }
  // The epoch's used samples (permutation order, steps_per_epoch * global_batch of them).
  virtual void prepare_epoch(const Samples& used) { (void)used; }
  virtual std::vector<MicroBatch> rank_step(int64_t step) = 0;
  // Step `step`'s global samples in permutation order.
  Samples step_samples(int64_t step) const {
    auto b = perm_.begin() + step * opt_.global_batch;
    return Samples(b, b + opt_.global_batch);
  }
  Samples contiguous_share(int64_t step) const {
    Samples all = step_samples(step);
    auto b = all.begin() + opt_.rank * local_batch();
    return Samples(b, b + local_batch());
  }

  SamplerOptions opt_;
  std::vector<int32_t> len_;  // a copy: the caller need not keep its vector alive

 private:
  int64_t steps_per_epoch_ = 0;
  int64_t position_ = 0;
  int64_t cached_epoch_ = -1;
  Samples perm_;
};

class RandomSampler : public SamplerBase {
 public:
  using SamplerBase::SamplerBase;
  std::vector<MicroBatch> rank_step(int64_t step) override {
    return chunk_single_rows(contiguous_share(step), opt_.micro_batch);
  }
};

class GlobalSortSampler : public SamplerBase {
 public:
  using SamplerBase::SamplerBase;
  std::vector<MicroBatch> rank_step(int64_t step) override {
    Samples all = step_samples(step);
    sort_longest_first(all, len_);
    Samples mine = snake_deal(all, opt_.world)[opt_.rank];
    sort_longest_first(mine, len_);
    return chunk_single_rows(mine, opt_.micro_batch);
  }
};

// Stratification: every local batch (step s, rank r) takes a fixed count from each length stratum. The
// epoch's used samples of stratum k (n_k of them, in permutation order) are spread over the S = steps*world
// local batches: each gets floor(n_k / S), and the e_k = n_k mod S leftovers are dealt round-robin over the
// local batches (one leftover per batch at most per stratum), so every local batch has exactly local_batch
// samples and the epoch still uses every sample exactly once.
class LocalPresortSampler : public SamplerBase {
 public:
  LocalPresortSampler(const SamplerOptions& opt, const std::vector<int32_t>& lengths) : SamplerBase(opt, lengths) {
    if (opt.strata.empty()) throw std::invalid_argument("sampler local_presort: data.strata is empty");
    for (size_t i = 1; i < opt.strata.size(); ++i)
      if (opt.strata[i] <= opt.strata[i - 1])
        throw std::invalid_argument("sampler local_presort: data.strata must be increasing upper bounds");
    group_ = std::clamp<int64_t>(opt.presort_group, 1, opt.world);
  }

 protected:
  int64_t stratum_of(int32_t length) const {
    auto it = std::lower_bound(opt_.strata.begin(), opt_.strata.end(), int64_t(length));
    return it - opt_.strata.begin();  // lengths above the last bound form one extra stratum
  }

  void prepare_epoch(const Samples& used) override {
    const int64_t K = int64_t(opt_.strata.size()) + 1;
    const int64_t S = steps_per_epoch() * opt_.world;
    std::vector<Samples> members(K);
    for (int64_t i : used) members[stratum_of(len_[i])].push_back(i);
    // Leftover slots: stratum k owns positions [E_k, E_k + e_k) of a sequence dealt round-robin over the
    // S local batches; position p goes to local batch p mod S. Sum of e_k is a multiple of S.
    std::vector<std::vector<int64_t>> count(S, std::vector<int64_t>(K));
    int64_t p = 0;
    for (int64_t k = 0; k < K; ++k) {
      const int64_t n = int64_t(members[k].size());
      for (int64_t j = 0; j < S; ++j) count[j][k] = n / S;
      for (int64_t x = 0; x < n % S; ++x, ++p) ++count[p % S][k];
    }
    // Local batch j = step * world + rank takes the next count[j][k] members of each stratum.
    local_.assign(S, {});
    std::vector<int64_t> next(K, 0);
    for (int64_t j = 0; j < S; ++j)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t c = 0; c < count[j][k]; ++c) local_[j].push_back(members[k][next[k]++]);
  }

  std::vector<MicroBatch> rank_step(int64_t step) override {
    const int64_t g0 = (opt_.rank / group_) * group_, g1 = std::min(opt_.world, g0 + group_);
    Samples pooled;
    for (int64_t r = g0; r < g1; ++r) {
      const Samples& lb = local_[step * opt_.world + r];
      pooled.insert(pooled.end(), lb.begin(), lb.end());
    }
    sort_longest_first(pooled, len_);
    Samples mine = snake_deal(pooled, g1 - g0)[opt_.rank - g0];
    sort_longest_first(mine, len_);
    return chunk_single_rows(mine, opt_.micro_batch);
  }

 private:
  int64_t group_ = 1;
  std::vector<Samples> local_;  // per local batch (step * world + rank): its stratified samples
};

// First-fit decreasing into rows of row_len tokens; a micro-batch is micro_batch rows.
class PackingSampler : public SamplerBase {
 public:
  PackingSampler(const SamplerOptions& opt, const std::vector<int32_t>& lengths) : SamplerBase(opt, lengths) {
    if (opt.row_len <= 0) throw std::invalid_argument("sampler packing: row_len (data.seq_len) must be > 0");
  }
  std::vector<MicroBatch> rank_step(int64_t step) override {
    Samples mine = contiguous_share(step);
    sort_longest_first(mine, len_);
    std::vector<std::vector<int64_t>> rows;
    std::vector<int64_t> room;
    for (int64_t i : mine) {
      size_t r = 0;
      while (r < rows.size() && room[r] < len_[i]) ++r;
      if (r == rows.size()) {
        rows.emplace_back();
        room.push_back(opt_.row_len);
      }
      rows[r].push_back(i);
      room[r] -= len_[i];
    }
    std::vector<MicroBatch> out;
    for (size_t i = 0; i < rows.size(); i += opt_.micro_batch) {
      MicroBatch mb;
      mb.rows.assign(rows.begin() + i, rows.begin() + std::min(rows.size(), i + size_t(opt_.micro_batch)));
      out.push_back(std::move(mb));
    }
    return out;
  }
};

}  // namespace

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> p(n);
  std::iota(p.begin(), p.end(), 0);
  SplitMix64 rng{seed * 0x9E3779B97F4A7C15ULL ^ (uint64_t(epoch) + 0x632BE59BD9B4E019ULL)};
  rng.next();
  for (int64_t i = n - 1; i > 0; --i) std::swap(p[i], p[rng.below(uint64_t(i) + 1)]);  // Fisher-Yates
  return p;
}

std::unique_ptr<BatchSampler> make_sampler(const SamplerOptions& opt, const std::vector<int32_t>& lengths) {
  auto bad = [&](const std::string& what) { throw std::invalid_argument("sampler " + opt.kind + ": " + what); };
  if (opt.world < 1 || opt.rank < 0 || opt.rank >= opt.world)
    bad("rank " + std::to_string(opt.rank) + " is outside world " + std::to_string(opt.world));
  if (opt.global_batch <= 0 || opt.global_batch % opt.world != 0)
    bad("batch.global=" + std::to_string(opt.global_batch) + " must be a positive multiple of the " +
        std::to_string(opt.world) + " ranks");
  if (opt.micro_batch <= 0) bad("batch.micro must be > 0");
  SamplerKind kind = SamplerKind::kRandom;
  try {
    kind = parse_choice<SamplerKind>(opt.kind);
  } catch (const ConfigError&) {
    bad("unknown kind; data.sampler must be one of random, global_sort, local_presort, packing");
  }
  switch (kind) {
    case SamplerKind::kRandom: return std::make_unique<RandomSampler>(opt, lengths);
    case SamplerKind::kGlobalSort: return std::make_unique<GlobalSortSampler>(opt, lengths);
    case SamplerKind::kLocalPresort: return std::make_unique<LocalPresortSampler>(opt, lengths);
    case SamplerKind::kPacking: return std::make_unique<PackingSampler>(opt, lengths);
  }
  return nullptr;
}

BatchLoad batch_load(const std::vector<MicroBatch>& micro_batches, const std::vector<int32_t>& lengths) {
  BatchLoad load;
  for (const auto& mb : micro_batches) {
    int64_t longest = 0;
    for (const auto& row : mb.rows) {
      int64_t row_tokens = 0;
      for (int64_t i : row) row_tokens += lengths[i];
      load.real_tokens += row_tokens;
      longest = std::max(longest, row_tokens);
    }
    load.computed_tokens += longest * int64_t(mb.rows.size());
  }
  return load;
}

}  // namespace bs
