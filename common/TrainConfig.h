// The training config: typed structs for every key of configs/train/*.yaml (README.md "Train").
// A TrainConfig fully determines a run together with its seed; to_yaml() writes back exactly what load() reads.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/Errors.h"

namespace YAML {
class Node;
}

namespace bs {

struct ModelConfig {
  int64_t vocab_size = 0;  // 0: take it from the dataset's vocab
  int64_t hidden = 128;
  int64_t layers = 2;
  int64_t heads = 2;
  int64_t intermediate = 512;
  int64_t max_position = 512;
  int64_t type_vocab_size = 2;
  double dropout = 0.1;
  // auto | fused | reference: fused CPU kernels (kernels/FusedOps.h) or the operator-by-operator path, which
  // stays the numerical reference. auto = fused wherever it is built (x86-64; BENCHMARKS.md section 10); GPUs:
  // LibTorch's ops either way.
  std::string kernels = "auto";
  // auto | on | off: the token-wise work (embeddings, QKV, projections, FFN, LayerNorm, GELU, dropout) only on
  // the real tokens of a micro-batch, attention on the padded [B, L] view. auto = on on the CPU; on CUDA off
  // (finding the real tokens reads the mask on the host, and CUDA graphs need fixed shapes).
  std::string unpad = "auto";
  // Start training from these weights: a bertsweep checkpoint-<step>.pt, or a PyTorch state dict (torch.save)
  // with Hugging Face / NVIDIA BERT parameter names. Empty: random initialisation from `seed`.
  std::string init_checkpoint;
};

struct DataConfig {
  std::string dir;        // prepared data: train_*.hdf5, eval.hdf5, vocab.txt
  std::string eval_file;  // default: <dir>/eval.hdf5
  int64_t seq_len = 128;
  std::string sampler = "random";                   // random | global_sort | local_presort | packing
  std::vector<int64_t> strata = {32, 64, 96, 128};  // upper bounds of the length bins (local_presort)
  int64_t presort_group = 8;                        // ranks that presort together (one node); 1 = purely local
  int64_t eval_samples = 0;                         // 0: the whole eval set
};

struct OptimizerConfig {
  std::string name = "adamw";  // adam | adamw | lamb | nvlamb | lans | sgd
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-6;
  double weight_decay = 0.01;
  bool bias_correction = true;
  double momentum = 0.9;                                                    // sgd
  bool nesterov = false;                                                    // sgd
  std::vector<std::string> no_decay = {"bias", "LayerNorm", "layer_norm"};  // name substrings
};

struct ScheduleConfig {
  std::string name = "poly";  // constant | poly | linear | cosine | inv_sqrt
  int64_t warmup_steps = -1;  // -1: use warmup_fraction
  double warmup_fraction = 0.0;
  int64_t start_warmup_step = 0;  // MLPerf's warmup start offset
  double power = 1.0;
  double end_lr = 0.0;
  int64_t total_steps = 0;  // 0: target.max_samples / batch.global
};

struct BatchConfig {
  int64_t global = 32;
  int64_t micro = 32;  // per rank; accumulation = global / (micro * ranks)
};

struct ClipConfig {
  std::string mode = "none";  // none | global_after_allreduce | bucket_before_allreduce | local_before_allreduce
  double max_norm = 1.0;
  double bucket_mb = 4.0;  // gradient bucket size for the overlapped allreduce
};

struct DistributedConfig {
  std::string backend = "auto";     // none | mpi | nccl | auto
  double timeout_s = 120.0;         // a peer silent this long is an error, not a hang
  std::string grad_dtype = "fp32";  // fp32 | compute: the dtype gradient buckets are all-reduced in
};

struct TargetConfig {
  double mlm_accuracy = 0.30;
  int64_t max_samples = 200000;
  int64_t eval_every_samples = 10000;
};

struct CheckpointConfig {
  std::string dir;            // empty: no checkpoints
  int64_t every_samples = 0;  // 0: only on SIGTERM
};

struct LogConfig {
  std::string mllog;  // MLPerf-style :::MLLOG file; empty: none
  int64_t progress_every_steps = 10;
  std::string op_profile;  // TSV of per-operator self time over the steps after the first progress window; empty: off
  // MLPerf submission keys of the MLLOG (training rules 5.0.0): closed only for a run the closed BERT rules allow.
  std::string submission_division = "open";  // open | closed
  std::string submission_org = "bertsweep";
  std::string submission_platform;             // empty: the CPU model, or the GPU's name on cuda
  std::string submission_status = "research";  // available | preview | research | onprem | cloud
};

struct TrainConfig {
  ModelConfig model;
  DataConfig data;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  BatchConfig batch;
  ClipConfig clip;
  DistributedConfig distributed;
  TargetConfig target;
  CheckpointConfig checkpoint;
  LogConfig log;
  int64_t threads = 0;  // 0: all cores of this process's share
  int64_t seed = 1;
  std::string device = "auto";     // auto | cpu | cuda
  std::string precision = "auto";  // auto | fp32 | bf16 | fp16: the compute dtype (masters stay fp32)

  // Reads a YAML file (following `extends:`), applies `key.path=value` overrides, checks types and ranges.
  static TrainConfig load(const std::string& path, const std::vector<std::string>& sets = {});
  // Same from an in-memory node; `source` names it in errors.
  static TrainConfig from_yaml(const YAML::Node& node, const std::string& source,
                               const std::vector<std::string>& sets = {});
  YAML::Node to_yaml() const;
  std::string to_yaml_string() const;

  // One key through the key table, the value parsed as YAML text as --set parses it. No range checks here:
  // some span keys (heads must divide hidden), so call validate() once every value is set.
  void set(const std::string& key, const std::string& value, const std::string& source);
  // A key's value as text, as to_yaml_string() writes it ("lamb", "4096", "0.001", "[32, 64]").
  std::string text(const std::string& key) const;
  // A numeric key's value (integer keys converted); throws ConfigError naming the key for any other key.
  double number(const std::string& key) const;

  // A config as stored with a result (a study's trial row, a confirmation run), for reading results: keys
  // an older bertsweep wrote that this one no longer knows, or values it no longer accepts, are skipped
  // (their defaults stay), and nothing is range-checked. Never for running: use from_yaml.
  static TrainConfig read_stored(const std::string& yaml_text);

  // Range and consistency checks; throws ConfigError naming the key.
  void validate(const std::string& source = "config") const;

  // The public key paths ("model.hidden", ...), for search spaces and --set.
  static const std::vector<std::string>& keys();
  static bool is_key(const std::string& path);
};

// Helpers shared by every YAML reader of the project.
namespace yaml {
// Loads a file with a clear error for a missing/unreadable file or a YAML syntax error (with line).
YAML::Node load_file(const std::string& path);
// YAML text with every alias expanded holds at most this many nodes: a config has a few hundred, while a
// few hundred bytes of nested aliases ("billion laughs") expand to billions, which every walk, merge and
// dump of the tree would then visit.
constexpr long long kMaxExpandedNodes = 100000;
// Counts the nodes of `text` with aliases expanded, from yaml-cpp's parser events (the tree is never
// built), and throws ConfigError naming `source` past kMaxExpandedNodes. Stops at the first node past it.
void check_alias_expansion(const std::string& text, const std::string& source);
// YAML that bertsweep stored itself (a study's or a trial's config in study.db): a damaged copy is a
// StudyError (exit 7) naming `source` (the file and the table) and the way back, not yaml-cpp's words.
YAML::Node load_stored(const std::string& text, const std::string& source);
// Sets `a.b.c` in a mapping to a YAML-parsed scalar (`--set a.b.c=value`).
void set_path(YAML::Node& root, const std::string& assignment, const std::string& source);
// "file:line" for a node, or just the file when the node has no mark.
std::string where(const YAML::Node& node, const std::string& source);
// Deep merge: keys of `over` replace those of `base` (mappings merge key by key, anything else replaces).
// Nodes are shared, not cloned, so that their line marks survive for error messages.
YAML::Node merge(YAML::Node base, const YAML::Node& over);
// The scalar at a dotted key path (`optimizer.lr`), or "" when the path is missing or not a scalar.
std::string scalar_at(const YAML::Node& root, const std::string& dotted_key);
}  // namespace yaml

}  // namespace bs
