#include "trainer/Trainer.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <optional>
#include <sstream>
#include <thread>

#include <ATen/record_function.h>

#include "common/Choices.h"
#include "common/JsonWriter.h"
#include "optimizers/LrSchedule.h"
#include "optimizers/Optimizer.h"
#include "dataset/Batch.h"
#include "trainer/BertModel.h"
#include "trainer/Checkpoint.h"
#include "distributed/Communicator.h"
#include "trainer/CudaDevice.h"
#include "trainer/EventLog.h"
#include "distributed/GradientBucketer.h"
#include "trainer/InitCheckpoint.h"
#include "trainer/MixedPrecision.h"
#include "trainer/OpProfile.h"
#include "trainer/Precision.h"
#include "trainer/Runtime.h"
#include "dataset/Sampler.h"
#include "dataset/ShardIO.h"

namespace bs {
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// A step of an allocation runs on the step's nodes, a job of its own on the job's.
std::string slurm_node_list() {
  for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"})
    if (std::string v = env_or_empty(name); !v.empty()) return v;
  return "";
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << (t % 3600) / 60 << "m";
  else if (t >= 60)
    os << t / 60 << "m" << t % 60 << "s";
  else
    os << t << "s";
  return os.str();
}

struct EvalResult {
  double accuracy = 0, loss = 0;
  int64_t masked = 0;
};

// The fixed eval set, collated once: rank r evaluates rows r, r+world, ...; counts are summed over ranks.
class Evaluator {
 public:
  Evaluator(const ShardData& eval, int64_t limit, int64_t rank, int64_t world, torch::Device device) {
    int64_t n = limit > 0 ? std::min(limit, eval.size()) : eval.size();
    // Sorting by length keeps eval batches dense; the metric does not depend on the batching.
    std::vector<int64_t> idx;
    const auto* len = eval.lengths.data_ptr<int32_t>();
    for (int64_t i = rank; i < n; i += world) idx.push_back(i);
    std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return len[a] > len[b]; });
    const int64_t kRows = 64;
    for (std::size_t s = 0; s < idx.size(); s += kRows) {
      MicroBatch mb;
      for (std::size_t i = s; i < std::min(idx.size(), s + kRows); ++i) mb.rows.push_back({idx[i]});
      batches_.push_back(to_device(collate(eval, mb), device));  // small: kept on the device
    }
    samples_ = n;
  }
  EvalResult run(BertForPretraining& model, Communicator& comm) {
    torch::NoGradGuard no_grad;
    model->eval();
    // Counts and losses stay on the device until the end: one read, not two per batch.
    std::vector<torch::Tensor> correct_t, loss_t;
    double total = 0;
    for (const auto& b : batches_) {
      auto out = model->forward(b.inputs);
      auto pred = out.mlm_logits.argmax(-1);
      correct_t.push_back(pred.eq(b.mlm_labels).sum().to(torch::kDouble));
      total += static_cast<double>(b.mlm_labels.numel());
      loss_t.push_back(
          torch::nn::functional::cross_entropy(out.mlm_logits.to(torch::kFloat), b.mlm_labels,
                                               torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum))
              .to(torch::kDouble));
    }
    model->train();
    double correct = 0, loss_sum = 0;
    if (!batches_.empty()) {
      auto sums = torch::stack({torch::stack(correct_t).sum(), torch::stack(loss_t).sum()}).cpu();
      correct = sums[0].item<double>();
      loss_sum = sums[1].item<double>();
    }
    auto all = comm.allgather({correct, total, loss_sum});
    double c = 0, t = 0, l = 0;
    for (std::size_t i = 0; i + 2 < all.size(); i += 3) {
      c += all[i];
      t += all[i + 1];
      l += all[i + 2];
    }
    EvalResult r;
    r.masked = static_cast<int64_t>(t);
    r.accuracy = t > 0 ? c / t : 0;
    r.loss = t > 0 ? l / t : 0;
    return r;
  }
  int64_t samples() const { return samples_; }

 private:
  std::vector<BertBatch> batches_;
  int64_t samples_ = 0;
};

// Refuses a model whose weights, gradients and optimizer state alone (bytes_per_param: fp32 master, gradient
// and two moments = 16, plus 2 for a bf16 compute copy) would not fit in the memory `have` of `where` (this
// machine or its GPU; activations come on top), with the estimate in the message: better than an allocation
// failure or swap.
void check_model_fits_in_memory(const ModelConfig& m, int64_t bytes_per_param, double have, const std::string& where) {
  const double H = double(m.hidden), I = double(m.intermediate);
  const double params = double(m.vocab_size + m.max_position + m.type_vocab_size) * H +
                        double(m.layers) * (4 * H * H + 2 * H * I + 9 * H + I) + 2 * H * H + 2 * H + 4 * H;
  const double need = params * double(bytes_per_param);
  if (have > 0 && need > 0.8 * have) {
    char buf[320];
    std::snprintf(buf, sizeof buf,
                  "%.3g parameters need %.1f GiB for weights, gradients and optimizer state alone; "
                  "%s has %.1f GiB",
                  params, need / 1073741824.0, where.c_str(), have / 1073741824.0);
    throw ConfigError(std::string("model: ") + buf + " (make model.hidden, model.layers or model.vocab_size smaller)");
  }
}

void write_params(const std::string& path, BertForPretraining& model) {
  std::vector<torch::Tensor> flat;
  for (const auto& p : model->parameters()) flat.push_back(p.detach().to(torch::kCPU, torch::kFloat).reshape(-1));
  auto all = torch::cat(flat).contiguous();
  std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error("--dump-params: cannot write " + path);
  std::fwrite(all.data_ptr<float>(), sizeof(float), all.numel(), f);
  std::fclose(f);
  fs::rename(tmp, path);
}

int64_t checked_threads(int64_t threads) {
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (threads > cores)
    throw ConfigError("threads: " + std::to_string(threads) + " is more than the " + std::to_string(cores) +
                      " cores of this machine; set threads: 0 (this process's share) or at most " +
                      std::to_string(cores));
  return threads;
}

// The communicator's backend depends on the device (nccl on CUDA), so the device is chosen first.
std::unique_ptr<Communicator> open_communicator(const DistributedConfig& dist, const PrecisionChoice& precision) {
  const bool cuda = precision.device.is_cuda();
  if (cuda) set_cuda_device(precision.device.index());
  return make_communicator(dist, cuda);
}

// Takes the vocab size from the data when the config leaves it 0; refuses a model that cannot read the shards.
void fit_model_to_data(ModelConfig& model, const Dataset& data) {
  if (model.vocab_size == 0) model.vocab_size = data.vocab_size;
  if (model.vocab_size < data.vocab_size)
    throw ConfigError("model.vocab_size (" + std::to_string(model.vocab_size) + ") is smaller than the vocab of " +
                      data.dir + " (" + std::to_string(data.vocab_size) +
                      " tokens): the vocab does not match the data; set model.vocab_size: 0 to take it from the data");
  if (data.train.seq_len() > model.max_position)
    throw ConfigError("the shards of " + data.dir + " have sequences of " + std::to_string(data.train.seq_len()) +
                      " tokens, above model.max_position (" + std::to_string(model.max_position) + ")");
}

void check_batch_splits(int64_t global, int64_t world) {
  if (global % world != 0)
    throw ConfigError("batch.global (" + std::to_string(global) + ") must be divisible by the number of ranks (" +
                      std::to_string(world) + ")");
}

// bf16/fp16 add a 2-byte compute copy to the 16 bytes of fp32 master, gradient and two moments.
void check_model_fits(const ModelConfig& model, const PrecisionChoice& precision) {
  const int64_t bytes_per_param = precision.mixed() ? 18 : 16;
  if (precision.device.is_cuda())
    check_model_fits_in_memory(model, bytes_per_param, double(cuda_device_info(precision.device.index()).memory_bytes),
                               "cuda:" + std::to_string(precision.device.index()));
  else
    check_model_fits_in_memory(model, bytes_per_param, double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)),
                               "this machine");
}

int64_t samples_of(const std::vector<MicroBatch>& micro) {
  int64_t n = 0;
  for (const auto& mb : micro) n += mb.samples();
  return n;
}

// What each rank contributes to the one small exchange per step, so that stop requests, NaN, load and time
// statistics agree on all ranks. values() is the wire format: six doubles per rank, in this order.
struct StepExchange {
  double loss = 0;       // this rank's batch-mean loss
  double nonfinite = 0;  // 1 when that loss is NaN/inf (NaN/inf in any micro-batch propagates)
  double stop = 0;       // 1 when SIGTERM/SIGINT arrived on this rank
  double real_tokens = 0;
  double computed_tokens = 0;  // with padding
  double compute_seconds = 0;

  static constexpr int64_t kFields = 6;
  std::vector<double> values() const { return {loss, nonfinite, stop, real_tokens, computed_tokens, compute_seconds}; }
  static StepExchange of_rank(const std::vector<double>& all, int64_t r) {
    const double* v = &all[static_cast<std::size_t>(r * kFields)];
    return {v[0], v[1], v[2], v[3], v[4], v[5]};
  }
};

// The exchange combined over ranks; every rank computes the same numbers in the same (rank) order.
struct StepTotals {
  double loss = 0;  // mean over ranks
  double nonfinite = 0, stop = 0, real_tokens = 0, computed_tokens = 0;
  double max_compute = 0, sum_compute = 0;
  std::vector<StepExchange> ranks;  // each rank's own numbers, for the rank_load event

  // The slowest rank's compute time over the mean: 1 when the load is balanced.
  double imbalance(int64_t world) const { return sum_compute > 0 ? max_compute / (sum_compute / world) : 1.0; }
};

StepTotals exchange(Communicator& comm, int64_t world, const StepExchange& mine) {
  const auto all = comm.allgather(mine.values());
  StepTotals t;
  t.ranks.reserve(world);
  for (int64_t r = 0; r < world; ++r) {
    const StepExchange x = StepExchange::of_rank(all, r);
    t.ranks.push_back(x);
    t.loss += x.loss / world;
    t.nonfinite += x.nonfinite;
    t.stop += x.stop;
    t.real_tokens += x.real_tokens;
    t.computed_tokens += x.computed_tokens;
    t.max_compute = std::max(t.max_compute, x.compute_seconds);
    t.sum_compute += x.compute_seconds;
  }
  return t;
}

struct StepOutcome {
  double lr = 0;
  double compute_seconds = 0, step_seconds = 0;
  BucketStats bucket;  // grad_norm, overlap
  StepTotals totals;
};

// Sums since the last throughput event: each event reports its window, not the whole run.
struct ThroughputWindow {
  double start = 0;  // run seconds when the window opened
  int64_t samples = 0, real_tokens = 0, computed_tokens = 0, steps = 0;
  double compute_seconds = 0, step_seconds = 0, imbalance_sum = 0, overlap_sum = 0;
  // Per rank: real and computed (padded) tokens and compute seconds, so a rank_load event shows which rank
  // the presorted batches left with more work.
  std::vector<double> rank_real, rank_computed, rank_compute;

  void add(int64_t global_batch, int64_t world, const StepOutcome& s) {
    const std::size_t n = s.totals.ranks.size();
    if (rank_real.size() != n) rank_real.assign(n, 0), rank_computed.assign(n, 0), rank_compute.assign(n, 0);
    for (std::size_t r = 0; r < n; ++r) {
      rank_real[r] += s.totals.ranks[r].real_tokens;
      rank_computed[r] += s.totals.ranks[r].computed_tokens;
      rank_compute[r] += s.totals.ranks[r].compute_seconds;
    }
    samples += global_batch;
    real_tokens += static_cast<int64_t>(s.totals.real_tokens);
    computed_tokens += static_cast<int64_t>(s.totals.computed_tokens);
    compute_seconds += s.compute_seconds;
    step_seconds += s.step_seconds;
    steps += 1;
    imbalance_sum += s.totals.imbalance(world);
    overlap_sum += s.bucket.overlap;
  }
  void restart(double now) {
    *this = ThroughputWindow{};
    start = now;
  }
};

// One training run (or one resumed segment of it) on this rank. The constructor is the MLPerf init phase
// (init_start .. init_stop); run() is the timed part, from run_start to run_stop.
class TrainingLoop {
 public:
  TrainingLoop(const TrainConfig& cfg, const TrainOptions& opt);
  TrainingLoop(const TrainingLoop&) = delete;  // the bucketer's hooks and the compute copy point into members
  TrainingLoop& operator=(const TrainingLoop&) = delete;

  TrainResult run();
  StepOutcome step();
  void report(const StepOutcome& s);
  bool eval_due() const { return st_.samples >= next_eval_ || st_.samples >= cfg_.target.max_samples; }
  bool evaluate();
  bool checkpoint_due() const { return st_.samples >= next_ckpt_; }
  void checkpoint();

 private:
  // Set up, in this order (it is also the order of the MLLOG lines and of the errors a bad config meets).
  void load_data();
  void build_model();
  void build_sampler();
  void resume();
  void announce();
  void log_submission();
  void log_hyperparameters();
  void log_optimizer_keys();

  void begin_run();
  torch::Tensor forward_backward(const std::vector<MicroBatch>& micro, int64_t local_samples, StepExchange& mine);
  void abort_nonfinite(double lr);
  void emit_throughput(const StepOutcome& s);
  void emit_rank_load();
  bool measure_accuracy();
  void start_block();
  void save();
  void log_run_stop(const std::string& status);
  [[noreturn]] void stop_on_signal();
  TrainResult finish();

  void say(const std::string& s) {
    if (lead_ && !opt_.quiet) std::cerr << s << std::endl;
  }
  double run_seconds() const { return seconds_before_ + since(t_run_); }

  // Declared in construction order: members are destroyed in reverse, the communicator after all its users.
  TrainConfig cfg_;
  const TrainOptions& opt_;
  RuntimeInfo rt_;
  PrecisionChoice precision_;
  std::unique_ptr<Communicator> comm_;
  int64_t rank_, world_;
  bool lead_;
  EventSink events_;
  MlLog mllog_;
  Dataset data_;
  int64_t accumulation_ = 0, total_steps_ = 0;
  BertForPretraining model_{nullptr};  // the fp32 masters: optimizer, checkpoints and exports use these
  std::unique_ptr<optim::Optimizer> optimizer_;
  std::unique_ptr<ComputeCopy> compute_;
  BertForPretraining* net_ = nullptr;  // what forward/backward run on: the compute copy or the masters
  std::optional<optim::LrSchedule> schedule_;
  torch::ScalarType reduce_dtype_ = torch::kFloat;
  std::unique_ptr<GradientBucketer> bucketer_;
  std::unique_ptr<BatchSampler> sampler_;
  std::optional<Evaluator> evaluator_;
  TrainState st_;
  TrainResult res_;

  // The timed run.
  Clock::time_point t_run_;
  double seconds_before_ = 0;  // training time of earlier (resumed) segments
  int64_t next_eval_ = 0, next_ckpt_ = 0;
  int64_t block_first_ = 0;  // first sample of the open MLLOG block
  ThroughputWindow window_;
  double last_loss_ = NAN;
  std::unique_ptr<OpProfile> op_profile_;  // log.op_profile, rank 0 only
  bool fused_loss_ = false;                // model.kernels resolves to fused: the loss too
};

TrainingLoop::TrainingLoop(const TrainConfig& cfg, const TrainOptions& opt)
    : cfg_(cfg), opt_(opt), rt_(configure_runtime(checked_threads(cfg.threads))), precision_(resolve_precision(cfg_)),
      comm_(open_communicator(cfg_.distributed, precision_)), rank_(comm_->rank()), world_(comm_->world()),
      lead_(rank_ == 0), events_(lead_ ? opt.events : ""), mllog_(lead_ ? cfg_.log.mllog : "") {
  load_data();
  build_model();
  build_sampler();
  resume();
  announce();
  log_submission();
  log_hyperparameters();
  if (lead_ && !cfg_.log.op_profile.empty()) op_profile_ = std::make_unique<OpProfile>();
  mllog_.end("init_stop");
}

void TrainingLoop::load_data() {
  // Ranks must agree on what they train: compare config hashes before any data is read.
  check_same_config(*comm_, cfg_.to_yaml_string());
  // `auto` reads each node's CPU: every rank must have resolved to the same device and precision.
  check_same_config(*comm_, "device: " + precision_.device_name + ", precision: " + precision_.precision);

  // MLPerf: caches are cleared before the run (the OS page cache is not dropped here: it is logged as the
  // rules ask, and the dataset is read once into memory below).
  mllog_.log("cache_clear", "true");
  mllog_.start("init_start");
  data_ = load_dataset(cfg_.data);
  fit_model_to_data(cfg_.model, data_);
  check_batch_splits(cfg_.batch.global, world_);
  check_model_fits(cfg_.model, precision_);
  const int64_t local_batch = cfg_.batch.global / world_;
  accumulation_ = (local_batch + cfg_.batch.micro - 1) / cfg_.batch.micro;
  total_steps_ = cfg_.schedule.total_steps > 0 ? cfg_.schedule.total_steps
                                               : (cfg_.target.max_samples + cfg_.batch.global - 1) / cfg_.batch.global;
}

void TrainingLoop::build_model() {
  torch::manual_seed(static_cast<uint64_t>(cfg_.seed));  // same initial weights on every rank
  model_ = BertForPretraining(cfg_.model);
  // The start weights replace the random ones before anything copies them (optimizer, bf16 compute copy).
  if (!cfg_.model.init_checkpoint.empty()) load_init_checkpoint(cfg_.model.init_checkpoint, model_);
  model_->to(precision_.device);  // initialised on the CPU: the same weights on every device
  optim::NamedParams named;
  for (const auto& kv : model_->named_parameters()) named.emplace_back(kv.key(), kv.value());
  optimizer_ = optim::make_optimizer(cfg_.optimizer, named);
  // Mixed precision: forward/backward on a bf16 copy refreshed from the masters after every step.
  if (precision_.mixed()) compute_ = std::make_unique<ComputeCopy>(model_, *optimizer_, precision_.compute);
  net_ = compute_ ? &compute_->model() : &model_;
  fused_loss_ = (*net_)->fused_kernels();
  // Dropout differs per rank (as in data-parallel BERT), reproducibly.
  torch::manual_seed(static_cast<uint64_t>(cfg_.seed) * 1000003ULL + static_cast<uint64_t>(rank_) + 1);
  schedule_.emplace(cfg_.schedule, cfg_.optimizer.lr, total_steps_);
  reduce_dtype_ =
      parse_choice<GradDtype>(cfg_.distributed.grad_dtype) == GradDtype::kCompute ? precision_.compute : torch::kFloat;
  // fp32 reduction: the buckets are ranges of the optimizer's flat gradient buffers (no copies).
  bucketer_ = std::make_unique<GradientBucketer>((*net_)->parameters(), *comm_, cfg_.clip, reduce_dtype_,
                                                 optimizer_->grad_buffers());
}

void TrainingLoop::build_sampler() {
  std::vector<int32_t> lengths(data_.train.lengths.data_ptr<int32_t>(),
                               data_.train.lengths.data_ptr<int32_t>() + data_.train.size());
  SamplerOptions so;
  so.kind = cfg_.data.sampler;
  so.global_batch = cfg_.batch.global;
  so.micro_batch = cfg_.batch.micro;
  so.rank = rank_;
  so.world = world_;
  so.presort_group = cfg_.data.presort_group;
  so.strata = cfg_.data.strata;
  so.row_len = data_.train.seq_len();
  so.seed = static_cast<uint64_t>(cfg_.seed);
  try {
    sampler_ = make_sampler(so, lengths);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("sampler: ") + e.what());
  }
  evaluator_.emplace(data_.eval, cfg_.data.eval_samples, rank_, world_, precision_.device);
}

void TrainingLoop::resume() {
  if (!opt_.resume) return;
  if (cfg_.checkpoint.dir.empty()) throw ConfigError("--resume needs checkpoint.dir in the config");
  if (load_checkpoint(cfg_.checkpoint.dir, rank_, model_, *optimizer_, st_)) {
    if (compute_) compute_->refresh();
    sampler_->seek(st_.step);
    say("resumed from " + cfg_.checkpoint.dir + " at step " + std::to_string(st_.step) + ", " +
        std::to_string(st_.samples) + " samples");
  } else {
    say("no checkpoint in " + cfg_.checkpoint.dir + ": starting from scratch");
  }
}

void TrainingLoop::announce() {
  say("bertsweep train: " + std::to_string(model_->num_parameters()) + " parameters, " + std::to_string(world_) +
      " rank(s), global batch " + std::to_string(cfg_.batch.global) + " (micro " + std::to_string(cfg_.batch.micro) +
      " x " + std::to_string(accumulation_) + " accumulation), sampler " + cfg_.data.sampler + ", optimizer " +
      cfg_.optimizer.name + ", clip " + cfg_.clip.mode + ", " + std::to_string(data_.train.size()) + " train / " +
      std::to_string(evaluator_->samples()) + " eval samples");
  say("runtime: " + describe(rt_) + ", communicator: " + comm_->backend());
  say("precision: " + precision_.precision + " compute, fp32 master weights and optimizer state, gradients " +
      (reduce_dtype_ == torch::kFloat ? "all-reduced in fp32" : "all-reduced in " + precision_.precision) +
      ", device " + precision_.device_name + " (" + precision_.reason + ")");
  events_.emit("start", JsonWriter()
                            .add("device", precision_.device_name)
                            .add("precision", precision_.precision)
                            .add("precision_reason", precision_.reason)
                            .add("parameters", model_->num_parameters())
                            .add("world", world_)
                            // Under srun: the job and step the controller signals and cancels this trial by.
                            .add("slurm_job_id", env_or_empty("SLURM_JOB_ID"))
                            .add("slurm_step_id", env_or_empty("SLURM_STEP_ID"))
                            // The nodes this trial's ranks run on (Slurm's compact form, "n[1-2]").
                            .add("slurm_nodes", slurm_node_list()));
}

// The MLPerf training 5.0.0 keys of a BERT run (mlperf_logging's compliance_checker/training_5.0.0).
void TrainingLoop::log_submission() {
  mllog_.point("submission_benchmark", std::string("bert"));
  mllog_.point("submission_org", cfg_.log.submission_org);
  mllog_.point("submission_division", cfg_.log.submission_division);
  mllog_.point("submission_status", cfg_.log.submission_status);
  std::string platform = cfg_.log.submission_platform;
  if (platform.empty()) {
    platform = precision_.device.is_cuda() ? cuda_device_info(precision_.device.index()).name : read_cpu_info().model;
    if (platform.empty()) platform = "unknown CPU";
    if (world_ > 1) platform = std::to_string(world_) + "x" + platform;
  }
  mllog_.point("submission_platform", platform);
}

void TrainingLoop::log_hyperparameters() {
  mllog_.point("seed", static_cast<double>(cfg_.seed));
  mllog_.point("global_batch_size", static_cast<double>(cfg_.batch.global));
  mllog_.point("gradient_accumulation_steps", static_cast<double>(accumulation_));
  mllog_.point("max_sequence_length", static_cast<double>(data_.train.seq_len()));
  mllog_.point("opt_name", cfg_.optimizer.name);
  mllog_.point("opt_base_learning_rate", cfg_.optimizer.lr);
  mllog_.point("opt_learning_rate_training_steps", static_cast<double>(total_steps_));
  mllog_.point("opt_learning_rate_warmup_steps", static_cast<double>(schedule_->warmup_steps()));
  mllog_.point("num_warmup_steps", static_cast<double>(schedule_->warmup_steps()));
  mllog_.point("start_warmup_step", static_cast<double>(cfg_.schedule.start_warmup_step));
  mllog_.point("opt_end_learning_rate", cfg_.schedule.end_lr);
  log_optimizer_keys();
  if (cfg_.clip.mode != "none") mllog_.point("opt_gradient_clip_norm", cfg_.clip.max_norm);
  mllog_.point("max_samples", static_cast<double>(cfg_.target.max_samples));
  mllog_.point("eval_samples", static_cast<double>(evaluator_->samples()));
  if (!cfg_.model.init_checkpoint.empty()) mllog_.point("init_checkpoint_step", static_cast<double>(0));
}

// Each optimizer's hyperparameters under the names mllog defines for it; LANS (not LAMB) and SGD have
// none there, so they get bertsweep's own opt_lans_* / opt_sgd_* names (the open division allows extra keys).
void TrainingLoop::log_optimizer_keys() {
  const OptimizerConfig& o = cfg_.optimizer;
  const OptimizerKind kind = parse_choice<OptimizerKind>(o.name);
  switch (kind) {
    case OptimizerKind::kLamb:
    case OptimizerKind::kNvLamb:
      mllog_.point("opt_lamb_beta_1", o.beta1);
      mllog_.point("opt_lamb_beta_2", o.beta2);
      mllog_.point("opt_lamb_epsilon", o.eps);
      mllog_.point("opt_lamb_weight_decay_rate", o.weight_decay);
      mllog_.point("opt_lamb_learning_rate_decay_poly_power", cfg_.schedule.power);
      break;
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      const bool adam = kind == OptimizerKind::kAdam;
      const std::string p = adam ? "opt_adam_" : "opt_adamw_";
      mllog_.point(p + "beta_1", o.beta1);
      mllog_.point(p + "beta_2", o.beta2);
      mllog_.point(p + "epsilon", o.eps);
      mllog_.point(adam ? "opt_weight_decay" : "opt_adamw_weight_decay", o.weight_decay);
      break;
    }
    case OptimizerKind::kLans:
      mllog_.point("opt_lans_beta_1", o.beta1);
      mllog_.point("opt_lans_beta_2", o.beta2);
      mllog_.point("opt_lans_epsilon", o.eps);
      mllog_.point("opt_lans_weight_decay_rate", o.weight_decay);
      break;
    case OptimizerKind::kSgd:
      mllog_.point("opt_sgd_momentum", o.momentum);
      mllog_.point("opt_weight_decay", o.weight_decay);
      break;
  }
}

TrainResult TrainingLoop::run() {
  begin_run();
  bool reached = false;
  while (!reached && st_.samples < cfg_.target.max_samples) {
    const StepOutcome s = step();
    report(s);
    if (eval_due()) reached = evaluate();
    st_.seconds = run_seconds();
    if (checkpoint_due()) checkpoint();
    if (s.totals.stop > 0 && !reached) stop_on_signal();
  }
  return finish();
}

void TrainingLoop::begin_run() {
  mllog_.start("run_start");
  t_run_ = Clock::now();
  seconds_before_ = st_.seconds;
  next_eval_ = (st_.samples / cfg_.target.eval_every_samples + 1) * cfg_.target.eval_every_samples;
  next_ckpt_ = cfg_.checkpoint.every_samples > 0
                   ? (st_.samples / cfg_.checkpoint.every_samples + 1) * cfg_.checkpoint.every_samples
                   : INT64_MAX;
  window_.restart(run_seconds());
  block_first_ = st_.samples;
  if (st_.samples < cfg_.target.max_samples) start_block();
}

StepOutcome TrainingLoop::step() {
  // The first progress window is warm-up (allocator, oneDNN primitive caches), as in the throughput events.
  const bool profiled = op_profile_ && st_.step >= cfg_.log.progress_every_steps;
  if (profiled) op_profile_->start();
  const auto t_step = Clock::now();
  const auto micro = sampler_->next_step();
  StepOutcome s;
  s.lr = schedule_->lr_at(st_.step);
  const int64_t local_samples = samples_of(micro);
  const auto t_compute = Clock::now();
  StepExchange mine;
  const torch::Tensor step_loss = forward_backward(micro, local_samples, mine);
  {
    RECORD_USER_SCOPE("bs::bucket_finish");  // the last buckets' allreduce and the clipping
    bucketer_->finish();
  }
  // The step's one synchronisation with the device: the gradient norm, communication times and the loss.
  s.bucket = bucketer_->step_stats(step_loss);
  mine.loss = s.bucket.loss;
  mine.nonfinite = std::isfinite(mine.loss) ? 0.0 : 1.0;
  s.compute_seconds = mine.compute_seconds = since(t_compute);
  mine.stop = g_stop.load() ? 1.0 : 0.0;
  s.totals = exchange(*comm_, world_, mine);
  if (s.totals.nonfinite > 0 || !std::isfinite(s.bucket.grad_norm)) abort_nonfinite(s.lr);
  {
    RECORD_USER_SCOPE("bs::optimizer_step");
    optimizer_->step(s.lr);
    optimizer_->zero_grad();
  }
  if (compute_) {
    RECORD_USER_SCOPE("bs::compute_copy_refresh");  // bf16 weights from the fp32 masters
    compute_->refresh();
  }
  st_.step += 1;
  st_.samples += cfg_.batch.global;
  last_loss_ = s.totals.loss;
  s.step_seconds = since(t_step);
  if (profiled) op_profile_->stop();
  return s;
}

// Returns the sum of w * loss over the micro-batches, still on the device; counts tokens into `mine`.
// Nothing here reads a device value: on a GPU the host runs ahead, collating and copying micro-batch i+1
// while i computes.
torch::Tensor TrainingLoop::forward_backward(const std::vector<MicroBatch>& micro, int64_t local_samples,
                                             StepExchange& mine) {
  int64_t real = 0, computed = 0;
  torch::Tensor step_loss;
  auto collated = [&](const MicroBatch& m) {
    RECORD_USER_SCOPE("bs::collate");
    return to_device(collate(data_.train, m), precision_.device);
  };
  BertBatch next = collated(micro[0]);
  for (std::size_t i = 0; i < micro.size(); ++i) {
    BertBatch b = std::move(next);
    real += b.real_tokens;
    computed += b.computed_tokens;
    bucketer_->begin_micro(i + 1 == micro.size());  // only the last micro-batch's backward communicates
    auto out = (*net_)->forward(b.inputs);
    auto loss = pretraining_loss(out, b.mlm_labels, b.nsp_labels, fused_loss_);
    // Weight by this micro-batch's share of the rank's samples: accumulation sums to the batch mean.
    const double w = static_cast<double>(b.samples) / static_cast<double>(std::max<int64_t>(1, local_samples));
    (loss.total * w).backward();
    auto weighted = loss.total.detach().to(torch::kDouble) * w;
    step_loss = step_loss.defined() ? step_loss + weighted : weighted;
    if (i + 1 < micro.size()) next = collated(micro[i + 1]);
  }
  mine.real_tokens = static_cast<double>(real);
  mine.computed_tokens = static_cast<double>(computed);
  return step_loss;
}

void TrainingLoop::abort_nonfinite(double lr) {
  log_run_stop("aborted");
  throw NonFiniteLoss("loss is NaN/inf at step " + std::to_string(st_.step) + " (" + std::to_string(st_.samples) +
                      " samples, lr " + std::to_string(lr) +
                      "): the run diverged; lower optimizer.lr, add warmup, or enable clipping");
}

void TrainingLoop::report(const StepOutcome& s) {
  window_.add(cfg_.batch.global, world_, s);
  const bool progress_due = st_.step % std::max<int64_t>(1, cfg_.log.progress_every_steps) == 0;
  if (!progress_due && st_.samples < cfg_.target.max_samples) return;
  emit_throughput(s);
  window_.restart(run_seconds());
}

void TrainingLoop::emit_throughput(const StepOutcome& s) {
  const ThroughputWindow& w = window_;
  const double wall = run_seconds() - w.start;
  const double sps = wall > 0 ? w.samples / wall : 0;
  const double tps = wall > 0 ? w.computed_tokens / wall : 0;
  const double waste = w.computed_tokens > 0 ? 1.0 - double(w.real_tokens) / double(w.computed_tokens) : 0;
  events_.emit("throughput", JsonWriter()
                                 .add("step", st_.step)
                                 .add("samples", st_.samples)
                                 .add("samples_per_s", sps)
                                 .add("tokens_per_s", tps)
                                 .add("effective_tokens_per_s", wall > 0 ? w.real_tokens / wall : 0.0)
                                 .add("padding_waste", waste)
                                 .add("imbalance", w.imbalance_sum / w.steps)
                                 .add("overlap", w.overlap_sum / w.steps)
                                 .add("step_seconds", w.step_seconds / w.steps)
                                 .add("compute_seconds", w.compute_seconds / w.steps)
                                 .add("grad_norm", s.bucket.grad_norm)
                                 .add("lr", s.lr)
                                 .add("loss", s.totals.loss));
  if (world_ > 1) emit_rank_load();
  if (!lead_ || opt_.quiet) return;
  const double eta = sps > 0 ? (cfg_.target.max_samples - st_.samples) / sps : NAN;
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "step %lld/%lld  samples %lld  %.1f samples/s  %.0f tok/s  loss %.4f  lr %.3g  "
                "eval %.4f  waste %.1f%%  ETA %s",
                static_cast<long long>(st_.step), static_cast<long long>(total_steps_),
                static_cast<long long>(st_.samples), sps, tps, s.totals.loss, s.lr, st_.last_accuracy, 100 * waste,
                fmt_duration(eta).c_str());
  std::cerr << buf << std::endl;
}

// The window's work per rank (arrays indexed by rank): what imbalance summarises as one number.
void TrainingLoop::emit_rank_load() {
  const ThroughputWindow& w = window_;
  events_.emit("rank_load", JsonWriter()
                                .add("step", st_.step)
                                .add("samples", st_.samples)
                                .add("steps", w.steps)
                                .add("real_tokens", w.rank_real)
                                .add("computed_tokens", w.rank_computed)
                                .add("compute_seconds", w.rank_compute));
}

// Closes the MLLOG block, evaluates, and opens the next block; true when the target accuracy is reached.
bool TrainingLoop::evaluate() {
  while (next_eval_ <= st_.samples) next_eval_ += cfg_.target.eval_every_samples;
  mllog_.end("block_stop",
             JsonWriter().add("first_epoch_num", block_first_).add("samples_count", st_.samples - block_first_));
  const bool reached = measure_accuracy();
  block_first_ = st_.samples;
  // No block when the budget is spent: run_stop follows.
  if (!reached && st_.samples < cfg_.target.max_samples) start_block();
  return reached;
}

bool TrainingLoop::measure_accuracy() {
  mllog_.start("eval_start", JsonWriter().add("epoch_num", st_.samples));
  EvalResult ev = evaluator_->run(*net_, *comm_);
  mllog_.end("eval_stop", JsonWriter().add("epoch_num", st_.samples));
  st_.last_accuracy = ev.accuracy;
  const double secs = run_seconds();
  events_.emit("eval", JsonWriter()
                           .add("step", st_.step)
                           .add("samples", st_.samples)
                           .add("mlm_accuracy", ev.accuracy)
                           .add("loss", ev.loss)
                           .add("train_loss", last_loss_)
                           .add("seconds", secs));
  mllog_.log("eval_accuracy", MlLog::number(ev.accuracy), "POINT_IN_TIME",
             JsonWriter().add("epoch_num", st_.samples).add("step", st_.step));
  say("eval @ " + std::to_string(st_.samples) + " samples (step " + std::to_string(st_.step) +
      "): masked-LM accuracy " + std::to_string(ev.accuracy) + ", loss " + std::to_string(ev.loss));
  if (ev.accuracy >= cfg_.target.mlm_accuracy) {
    res_.reached = true;
    res_.samples_to_target = st_.samples;
    res_.seconds_to_target = secs;
    return true;
  }
  return false;
}

// MLLOG blocks: one per eval interval, in samples (BERT's epoch_num is the number of samples trained).
void TrainingLoop::start_block() {
  const int64_t end = std::min(next_eval_, cfg_.target.max_samples);
  const int64_t steps = std::max<int64_t>(1, (end - st_.samples + cfg_.batch.global - 1) / cfg_.batch.global);
  JsonWriter md;
  md.add("first_epoch_num", st_.samples)
      .add("epoch_count", steps * cfg_.batch.global)
      .add("samples_count", steps * cfg_.batch.global);
  mllog_.start("block_start", md);
}

void TrainingLoop::checkpoint() {
  while (next_ckpt_ <= st_.samples) next_ckpt_ += cfg_.checkpoint.every_samples;
  save();
}

void TrainingLoop::save() {
  if (!cfg_.checkpoint.dir.empty())
    save_checkpoint(cfg_.checkpoint.dir, rank_, world_, model_, *optimizer_, st_, *comm_);
}

// train_samples precedes run_stop, as the RCP checker reads them.
void TrainingLoop::log_run_stop(const std::string& status) {
  mllog_.point("train_samples", static_cast<double>(st_.samples));
  mllog_.end("run_stop", JsonWriter().add("status", status));
}

// Every rank sees the same stop flag (it is in the step exchange), so all save and leave at the same step.
void TrainingLoop::stop_on_signal() {
  save();
  log_run_stop("aborted");
  throw Terminated("stopped by signal at step " + std::to_string(st_.step) + " (" + std::to_string(st_.samples) +
                   " samples)" + (cfg_.checkpoint.dir.empty() ? "" : "; checkpoint in " + cfg_.checkpoint.dir));
}

TrainResult TrainingLoop::finish() {
  res_.samples = st_.samples;
  res_.steps = st_.step;
  res_.seconds = run_seconds();
  res_.final_mlm_accuracy = st_.last_accuracy;
  log_run_stop(res_.reached ? "success" : "aborted");
  JsonWriter d;
  d.add("reached", res_.reached).add("samples", res_.samples).add("steps", res_.steps).add("seconds", res_.seconds);
  if (res_.reached) d.add("samples_to_target", res_.samples_to_target).add("seconds_to_target", res_.seconds_to_target);
  else
    d.add_null("samples_to_target").add_null("seconds_to_target");
  d.add("final_mlm_accuracy", res_.final_mlm_accuracy).add("target", cfg_.target.mlm_accuracy);
  events_.emit("done", d);
  say(res_.reached ? "reached masked-LM accuracy " + std::to_string(res_.final_mlm_accuracy) + " >= target " +
                         std::to_string(cfg_.target.mlm_accuracy) + " after " + std::to_string(res_.samples_to_target) +
                         " samples, " + fmt_duration(res_.seconds_to_target)
                   : "target " + std::to_string(cfg_.target.mlm_accuracy) + " not reached within " +
                         std::to_string(cfg_.target.max_samples) + " samples (final accuracy " +
                         std::to_string(res_.final_mlm_accuracy) + ")");
  if (!opt_.dump_params.empty() && lead_) write_params(opt_.dump_params, model_);
  if (op_profile_) op_profile_->write_tsv(cfg_.log.op_profile);
  if (!cfg_.checkpoint.dir.empty()) save();
  comm_->barrier();
  return res_;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

TrainResult train(const TrainConfig& cfg, const TrainOptions& opt) {
  TrainingLoop loop(cfg, opt);
  return loop.run();
}

}  // namespace bs
