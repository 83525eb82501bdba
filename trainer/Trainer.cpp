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
#include <numeric>
#include <sstream>
#include <thread>

#include "common/JsonWriter.h"
#include "optimizers/LrSchedule.h"
#include "optimizers/Optimizer.h"
#include "trainer/Batch.h"
#include "trainer/BertModel.h"
#include "trainer/Checkpoint.h"
#include "trainer/Communicator.h"
#include "trainer/CudaDevice.h"
#include "trainer/EventLog.h"
#include "trainer/GradientBucketer.h"
#include "trainer/InitCheckpoint.h"
#include "trainer/MixedPrecision.h"
#include "trainer/Precision.h"
#include "trainer/Runtime.h"
#include "trainer/Sampler.h"
#include "trainer/ShardIO.h"

namespace bs {
namespace fs = std::filesystem;

namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string fmt_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  std::ostringstream os;
  if (t >= 3600) os << t / 3600 << "h" << (t % 3600) / 60 << "m";
  else if (t >= 60) os << t / 60 << "m" << t % 60 << "s";
  else os << t << "s";
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
      loss_t.push_back(torch::nn::functional::cross_entropy(
                           out.mlm_logits.to(torch::kFloat), b.mlm_labels,
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
    std::snprintf(buf, sizeof buf, "%.3g parameters need %.1f GiB for weights, gradients and optimizer state alone; "
                  "%s has %.1f GiB", params, need / 1073741824.0, where.c_str(), have / 1073741824.0);
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

}  // namespace

void install_stop_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

TrainResult train(const TrainConfig& cfg_in, const TrainOptions& opt) {
  TrainConfig cfg = cfg_in;
  const auto t_init = Clock::now();
  const int64_t cores = std::max<int64_t>(1, std::thread::hardware_concurrency());
  if (cfg.threads > cores)
    throw ConfigError("threads: " + std::to_string(cfg.threads) + " is more than the " + std::to_string(cores) +
                      " cores of this machine; set threads: 0 (this process's share) or at most " +
                      std::to_string(cores));
  RuntimeInfo rt = configure_runtime(cfg.threads);
  // Device and precision first: the communicator's backend depends on the device.
  const PrecisionChoice precision = resolve_precision(cfg);
  const bool cuda = precision.device.is_cuda();
  if (cuda) set_cuda_device(precision.device.index());
  auto comm = make_communicator(cfg.distributed, cuda);
  const int64_t rank = comm->rank(), world = comm->world();
  const bool lead = rank == 0;
  EventSink events(lead ? opt.events : "");
  MlLog mllog(lead ? cfg.log.mllog : "");
  auto say = [&](const std::string& s) {
    if (lead && !opt.quiet) std::cerr << s << std::endl;
  };

  // Ranks must agree on what they train: compare config hashes before any data is read.
  check_same_config(*comm, cfg.to_yaml_string());
  // `auto` reads each node's CPU: every rank must have resolved to the same device and precision.
  check_same_config(*comm, "device: " + precision.device_name + ", precision: " + precision.precision);

  // MLPerf: caches are cleared before the run (the OS page cache is not dropped here: it is logged as the
  // rules ask, and the dataset is read once into memory below).
  mllog.log("cache_clear", "true");
  mllog.start("init_start");
  Dataset data = load_dataset(cfg.data);
  if (cfg.model.vocab_size == 0) cfg.model.vocab_size = data.vocab_size;
  if (cfg.model.vocab_size < data.vocab_size)
    throw ConfigError("model.vocab_size (" + std::to_string(cfg.model.vocab_size) + ") is smaller than the vocab of " +
                      data.dir + " (" + std::to_string(data.vocab_size) +
                      " tokens): the vocab does not match the data; set model.vocab_size: 0 to take it from the data");
  if (data.train.seq_len() > cfg.model.max_position)
    throw ConfigError("the shards of " + data.dir + " have sequences of " + std::to_string(data.train.seq_len()) +
                      " tokens, above model.max_position (" + std::to_string(cfg.model.max_position) + ")");
  if (cfg.batch.global % world != 0)
    throw ConfigError("batch.global (" + std::to_string(cfg.batch.global) + ") must be divisible by the number of ranks (" +
                      std::to_string(world) + ")");
  if (cuda)
    check_model_fits_in_memory(cfg.model, precision.mixed() ? 18 : 16,
                               double(cuda_device_info(precision.device.index()).memory_bytes),
                               "cuda:" + std::to_string(precision.device.index()));
  else
    check_model_fits_in_memory(cfg.model, precision.mixed() ? 18 : 16,
                               double(sysconf(_SC_PHYS_PAGES)) * double(sysconf(_SC_PAGE_SIZE)), "this machine");
  const int64_t local_batch = cfg.batch.global / world;
  const int64_t accumulation = (local_batch + cfg.batch.micro - 1) / cfg.batch.micro;
  const int64_t total_steps =
      cfg.schedule.total_steps > 0 ? cfg.schedule.total_steps
                                   : (cfg.target.max_samples + cfg.batch.global - 1) / cfg.batch.global;

  torch::manual_seed(static_cast<uint64_t>(cfg.seed));  // same initial weights on every rank
  BertForPretraining model(cfg.model);  // the fp32 masters: optimizer, checkpoints and exports use these
  // The start weights replace the random ones before anything copies them (optimizer, bf16 compute copy).
  if (!cfg.model.init_checkpoint.empty()) load_init_checkpoint(cfg.model.init_checkpoint, model);
  model->to(precision.device);           // initialised on the CPU: the same weights on every device
  optim::NamedParams named;
  for (const auto& kv : model->named_parameters()) named.emplace_back(kv.key(), kv.value());
  auto optimizer = optim::make_optimizer(cfg.optimizer, named);
  // Mixed precision: forward/backward on a bf16 copy refreshed from the masters after every step.
  std::unique_ptr<ComputeCopy> compute;
  if (precision.mixed()) compute = std::make_unique<ComputeCopy>(model, *optimizer, precision.compute);
  BertForPretraining& net = compute ? compute->model() : model;
  // Dropout differs per rank (as in data-parallel BERT), reproducibly.
  torch::manual_seed(static_cast<uint64_t>(cfg.seed) * 1000003ULL + static_cast<uint64_t>(rank) + 1);
  optim::LrSchedule schedule(cfg.schedule, cfg.optimizer.lr, total_steps);
  const torch::ScalarType reduce_dtype = cfg.distributed.grad_dtype == "compute" ? precision.compute : torch::kFloat;
  // fp32 reduction: the buckets are ranges of the optimizer's flat gradient buffers (no copies).
  GradientBucketer bucketer(net->parameters(), *comm, cfg.clip, reduce_dtype, optimizer->grad_buffers());

  std::vector<int32_t> lengths(data.train.lengths.data_ptr<int32_t>(),
                               data.train.lengths.data_ptr<int32_t>() + data.train.size());
  SamplerOptions so;
  so.kind = cfg.data.sampler;
  so.global_batch = cfg.batch.global;
  so.micro_batch = cfg.batch.micro;
  so.rank = rank;
  so.world = world;
  so.presort_group = cfg.data.presort_group;
  so.strata = cfg.data.strata;
  so.row_len = data.train.seq_len();
  so.seed = static_cast<uint64_t>(cfg.seed);
  std::unique_ptr<BatchSampler> sampler;
  try {
    sampler = make_sampler(so, lengths);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("sampler: ") + e.what());
  }
  Evaluator evaluator(data.eval, cfg.data.eval_samples, rank, world, precision.device);

  TrainResult res;
  TrainState st;
  if (opt.resume) {
    if (cfg.checkpoint.dir.empty()) throw ConfigError("--resume needs checkpoint.dir in the config");
    if (load_checkpoint(cfg.checkpoint.dir, rank, model, *optimizer, st)) {
      if (compute) compute->refresh();
      sampler->seek(st.step);
      say("resumed from " + cfg.checkpoint.dir + " at step " + std::to_string(st.step) + ", " +
          std::to_string(st.samples) + " samples");
    } else {
      say("no checkpoint in " + cfg.checkpoint.dir + ": starting from scratch");
    }
  }
  auto save = [&]() {
    if (!cfg.checkpoint.dir.empty()) save_checkpoint(cfg.checkpoint.dir, rank, world, model, *optimizer, st, *comm);
  };

  say("bertsweep train: " + std::to_string(model->num_parameters()) + " parameters, " + std::to_string(world) +
      " rank(s), global batch " + std::to_string(cfg.batch.global) + " (micro " + std::to_string(cfg.batch.micro) +
      " x " + std::to_string(accumulation) + " accumulation), sampler " + cfg.data.sampler + ", optimizer " +
      cfg.optimizer.name + ", clip " + cfg.clip.mode + ", " + std::to_string(data.train.size()) + " train / " +
      std::to_string(evaluator.samples()) + " eval samples");
  say("runtime: " + describe(rt) + ", communicator: " + comm->backend());
  say("precision: " + precision.precision + " compute, fp32 master weights and optimizer state, gradients " +
      (reduce_dtype == torch::kFloat ? "all-reduced in fp32" : "all-reduced in " + precision.precision) +
      ", device " + precision.device_name + " (" + precision.reason + ")");
  events.emit("start", JsonWriter()
                           .add("device", precision.device_name)
                           .add("precision", precision.precision)
                           .add("precision_reason", precision.reason)
                           .add("parameters", model->num_parameters())
                           .add("world", world)
                           // Under srun: the job and step the controller signals and cancels this trial by.
                           .add("slurm_job_id", env_or_empty("SLURM_JOB_ID"))
                           .add("slurm_step_id", env_or_empty("SLURM_STEP_ID")));

  // The MLPerf training 5.0.0 keys of a BERT run (mlperf_logging's compliance_checker/training_5.0.0).
  mllog.point("submission_benchmark", std::string("bert"));
  mllog.point("submission_org", cfg.log.submission_org);
  mllog.point("submission_division", cfg.log.submission_division);
  mllog.point("submission_status", cfg.log.submission_status);
  std::string platform = cfg.log.submission_platform;
  if (platform.empty()) {
    platform = cuda ? cuda_device_info(precision.device.index()).name : read_cpu_info().model;
    if (platform.empty()) platform = "unknown CPU";
    if (world > 1) platform = std::to_string(world) + "x" + platform;
  }
  mllog.point("submission_platform", platform);
  mllog.point("seed", static_cast<double>(cfg.seed));
  mllog.point("global_batch_size", static_cast<double>(cfg.batch.global));
  mllog.point("gradient_accumulation_steps", static_cast<double>(accumulation));
  mllog.point("max_sequence_length", static_cast<double>(data.train.seq_len()));
  mllog.point("opt_name", cfg.optimizer.name);
  mllog.point("opt_base_learning_rate", cfg.optimizer.lr);
  mllog.point("opt_learning_rate_training_steps", static_cast<double>(total_steps));
  mllog.point("opt_learning_rate_warmup_steps", static_cast<double>(schedule.warmup_steps()));
  mllog.point("num_warmup_steps", static_cast<double>(schedule.warmup_steps()));
  mllog.point("start_warmup_step", static_cast<double>(cfg.schedule.start_warmup_step));
  mllog.point("opt_end_learning_rate", cfg.schedule.end_lr);
  // Each optimizer's hyperparameters under the names mllog defines for it; LANS (not LAMB) and SGD have
  // none there, so they get bertsweep's own opt_lans_* / opt_sgd_* names (the open division allows extra keys).
  const std::string& on = cfg.optimizer.name;
  if (on == "lamb" || on == "nvlamb") {
    mllog.point("opt_lamb_beta_1", cfg.optimizer.beta1);
    mllog.point("opt_lamb_beta_2", cfg.optimizer.beta2);
    mllog.point("opt_lamb_epsilon", cfg.optimizer.eps);
    mllog.point("opt_lamb_weight_decay_rate", cfg.optimizer.weight_decay);
    mllog.point("opt_lamb_learning_rate_decay_poly_power", cfg.schedule.power);
  } else if (on == "adam" || on == "adamw") {
    const std::string p = on == "adam" ? "opt_adam_" : "opt_adamw_";
    mllog.point(p + "beta_1", cfg.optimizer.beta1);
    mllog.point(p + "beta_2", cfg.optimizer.beta2);
    mllog.point(p + "epsilon", cfg.optimizer.eps);
    mllog.point(on == "adam" ? "opt_weight_decay" : "opt_adamw_weight_decay", cfg.optimizer.weight_decay);
  } else if (on == "lans") {
    mllog.point("opt_lans_beta_1", cfg.optimizer.beta1);
    mllog.point("opt_lans_beta_2", cfg.optimizer.beta2);
    mllog.point("opt_lans_epsilon", cfg.optimizer.eps);
    mllog.point("opt_lans_weight_decay_rate", cfg.optimizer.weight_decay);
  } else {
    mllog.point("opt_sgd_momentum", cfg.optimizer.momentum);
    mllog.point("opt_weight_decay", cfg.optimizer.weight_decay);
  }
  if (cfg.clip.mode != "none") mllog.point("opt_gradient_clip_norm", cfg.clip.max_norm);
  mllog.point("max_samples", static_cast<double>(cfg.target.max_samples));
  mllog.point("eval_samples", static_cast<double>(evaluator.samples()));
  if (!cfg.model.init_checkpoint.empty()) mllog.point("init_checkpoint_step", static_cast<double>(0));
  mllog.end("init_stop");
  mllog.start("run_start");

  const auto t_run = Clock::now();
  const double seconds_before = st.seconds;  // training time of earlier (resumed) segments
  auto run_seconds = [&]() { return seconds_before + since(t_run); };
  int64_t next_eval = (st.samples / cfg.target.eval_every_samples + 1) * cfg.target.eval_every_samples;
  int64_t next_ckpt = cfg.checkpoint.every_samples > 0
                          ? (st.samples / cfg.checkpoint.every_samples + 1) * cfg.checkpoint.every_samples
                          : INT64_MAX;
  double window_start = run_seconds();
  int64_t window_samples = 0, window_real = 0, window_computed = 0, window_steps = 0;
  double window_compute = 0, window_step_time = 0, last_loss = NAN, imbalance_sum = 0, overlap_sum = 0;
  (void)t_init;
  // MLLOG blocks: one per eval interval, in samples (BERT's epoch_num is the number of samples trained).
  auto block_start = [&]() {
    const int64_t end = std::min(next_eval, cfg.target.max_samples);
    const int64_t steps = std::max<int64_t>(1, (end - st.samples + cfg.batch.global - 1) / cfg.batch.global);
    JsonWriter md;
    md.add("first_epoch_num", st.samples).add("epoch_count", steps * cfg.batch.global)
        .add("samples_count", steps * cfg.batch.global);
    mllog.start("block_start", md);
  };
  int64_t block_first = st.samples;
  // train_samples precedes run_stop, as the RCP checker reads them.
  auto log_run_stop = [&](const std::string& status) {
    mllog.point("train_samples", static_cast<double>(st.samples));
    mllog.end("run_stop", JsonWriter().add("status", status));
  };
  if (st.samples < cfg.target.max_samples) block_start();

  auto do_eval = [&]() -> bool {
    mllog.start("eval_start", JsonWriter().add("epoch_num", st.samples));
    EvalResult ev = evaluator.run(net, *comm);
    mllog.end("eval_stop", JsonWriter().add("epoch_num", st.samples));
    st.last_accuracy = ev.accuracy;
    const double secs = run_seconds();
    events.emit("eval", JsonWriter()
                            .add("step", st.step)
                            .add("samples", st.samples)
                            .add("mlm_accuracy", ev.accuracy)
                            .add("loss", ev.loss)
                            .add("train_loss", last_loss)
                            .add("seconds", secs));
    mllog.log("eval_accuracy", MlLog::number(ev.accuracy), "POINT_IN_TIME",
              JsonWriter().add("epoch_num", st.samples).add("step", st.step));
    say("eval @ " + std::to_string(st.samples) + " samples (step " + std::to_string(st.step) +
        "): masked-LM accuracy " + std::to_string(ev.accuracy) + ", loss " + std::to_string(ev.loss));
    if (ev.accuracy >= cfg.target.mlm_accuracy) {
      res.reached = true;
      res.samples_to_target = st.samples;
      res.seconds_to_target = secs;
      return true;
    }
    return false;
  };

  bool done = false;
  while (!done && st.samples < cfg.target.max_samples) {
    const auto t_step = Clock::now();
    auto micro = sampler->next_step();
    const double lr = schedule.lr_at(st.step);
    int64_t real = 0, computed = 0;
    int64_t local_samples = 0;
    for (const auto& mb : micro) local_samples += mb.samples();
    const auto t_compute = Clock::now();
    // Nothing below reads a device value until the step's statistics: on a GPU the host runs ahead,
    // collating and copying micro-batch i+1 while i computes.
    torch::Tensor step_loss;  // sum of w * loss over micro-batches, on the device
    BertBatch next = to_device(collate(data.train, micro[0]), precision.device);
    for (std::size_t i = 0; i < micro.size(); ++i) {
      BertBatch b = std::move(next);
      real += b.real_tokens;
      computed += b.computed_tokens;
      bucketer.begin_micro(i + 1 == micro.size());
      auto out = net->forward(b.inputs);
      auto loss = pretraining_loss(out, b.mlm_labels, b.nsp_labels);
      // Weight by this micro-batch's share of the rank's samples: accumulation sums to the batch mean.
      const double w = static_cast<double>(b.samples) / static_cast<double>(std::max<int64_t>(1, local_samples));
      (loss.total * w).backward();
      auto weighted = loss.total.detach().to(torch::kDouble) * w;
      step_loss = step_loss.defined() ? step_loss + weighted : weighted;
      if (i + 1 < micro.size()) next = to_device(collate(data.train, micro[i + 1]), precision.device);
    }
    bucketer.finish();
    // The step's one synchronisation with the device: the gradient norm, communication times and the loss.
    BucketStats bstats = bucketer.step_stats(step_loss);
    const double loss_sum = bstats.loss;
    const double nonfinite = std::isfinite(loss_sum) ? 0.0 : 1.0;  // NaN/inf in any micro-batch propagates
    const double compute_s = since(t_compute);
    // One small exchange per step: stop requests, NaN, load and time statistics agree on all ranks.
    auto all = comm->allgather({loss_sum, nonfinite, g_stop.load() ? 1.0 : 0.0, static_cast<double>(real),
                                static_cast<double>(computed), compute_s});
    double g_loss = 0, g_nonfinite = 0, g_stop_req = 0, g_real = 0, g_computed = 0, max_c = 0, sum_c = 0;
    for (int64_t r = 0; r < world; ++r) {
      g_loss += all[r * 6 + 0] / world;
      g_nonfinite += all[r * 6 + 1];
      g_stop_req += all[r * 6 + 2];
      g_real += all[r * 6 + 3];
      g_computed += all[r * 6 + 4];
      max_c = std::max(max_c, all[r * 6 + 5]);
      sum_c += all[r * 6 + 5];
    }
    if (g_nonfinite > 0 || !std::isfinite(bstats.grad_norm)) {
      log_run_stop("aborted");
      throw NonFiniteLoss("loss is NaN/inf at step " + std::to_string(st.step) + " (" + std::to_string(st.samples) +
                          " samples, lr " + std::to_string(lr) +
                          "): the run diverged; lower optimizer.lr, add warmup, or enable clipping");
    }
    optimizer->step(lr);
    optimizer->zero_grad();
    if (compute) compute->refresh();
    st.step += 1;
    st.samples += cfg.batch.global;
    last_loss = g_loss;
    const double step_s = since(t_step);
    window_samples += cfg.batch.global;
    window_real += static_cast<int64_t>(g_real);
    window_computed += static_cast<int64_t>(g_computed);
    window_compute += compute_s;
    window_step_time += step_s;
    window_steps += 1;
    imbalance_sum += sum_c > 0 ? max_c / (sum_c / world) : 1.0;
    overlap_sum += bstats.overlap;

    const bool progress_due = st.step % std::max<int64_t>(1, cfg.log.progress_every_steps) == 0;
    if (progress_due || st.samples >= cfg.target.max_samples) {
      const double wall = run_seconds() - window_start;
      const double sps = wall > 0 ? window_samples / wall : 0;
      const double tps = wall > 0 ? window_computed / wall : 0;
      const double waste = window_computed > 0 ? 1.0 - double(window_real) / double(window_computed) : 0;
      events.emit("throughput", JsonWriter()
                                    .add("step", st.step)
                                    .add("samples", st.samples)
                                    .add("samples_per_s", sps)
                                    .add("tokens_per_s", tps)
                                    .add("effective_tokens_per_s", wall > 0 ? window_real / wall : 0.0)
                                    .add("padding_waste", waste)
                                    .add("imbalance", imbalance_sum / window_steps)
                                    .add("overlap", overlap_sum / window_steps)
                                    .add("step_seconds", window_step_time / window_steps)
                                    .add("compute_seconds", window_compute / window_steps)
                                    .add("grad_norm", bstats.grad_norm)
                                    .add("lr", lr)
                                    .add("loss", g_loss));
      if (lead && !opt.quiet) {
        const double eta = sps > 0 ? (cfg.target.max_samples - st.samples) / sps : NAN;
        char buf[320];
        std::snprintf(buf, sizeof buf,
                      "step %lld/%lld  samples %lld  %.1f samples/s  %.0f tok/s  loss %.4f  lr %.3g  "
                      "eval %.4f  waste %.1f%%  ETA %s",
                      static_cast<long long>(st.step), static_cast<long long>(total_steps),
                      static_cast<long long>(st.samples), sps, tps, g_loss, lr, st.last_accuracy, 100 * waste,
                      fmt_duration(eta).c_str());
        std::cerr << buf << std::endl;
      }
      window_start = run_seconds();
      window_samples = window_real = window_computed = window_steps = 0;
      window_compute = window_step_time = imbalance_sum = overlap_sum = 0;
    }
    if (st.samples >= next_eval || st.samples >= cfg.target.max_samples) {
      while (next_eval <= st.samples) next_eval += cfg.target.eval_every_samples;
      mllog.end("block_stop", JsonWriter().add("first_epoch_num", block_first).add("samples_count", st.samples - block_first));
      done = do_eval();
      block_first = st.samples;
      // No block when the budget is spent: run_stop follows.
      if (!done && st.samples < cfg.target.max_samples) block_start();
    }
    st.seconds = run_seconds();
    if (st.samples >= next_ckpt) {
      while (next_ckpt <= st.samples) next_ckpt += cfg.checkpoint.every_samples;
      save();
    }
    if (g_stop_req > 0 && !done) {
      save();
      log_run_stop("aborted");
      throw Terminated("stopped by signal at step " + std::to_string(st.step) + " (" + std::to_string(st.samples) +
                       " samples)" + (cfg.checkpoint.dir.empty() ? "" : "; checkpoint in " + cfg.checkpoint.dir));
    }
  }
  res.samples = st.samples;
  res.steps = st.step;
  res.seconds = run_seconds();
  res.final_mlm_accuracy = st.last_accuracy;
  log_run_stop(res.reached ? "success" : "aborted");
  JsonWriter d;
  d.add("reached", res.reached).add("samples", res.samples).add("steps", res.steps).add("seconds", res.seconds);
  if (res.reached) d.add("samples_to_target", res.samples_to_target).add("seconds_to_target", res.seconds_to_target);
  else d.add_null("samples_to_target").add_null("seconds_to_target");
  d.add("final_mlm_accuracy", res.final_mlm_accuracy).add("target", cfg.target.mlm_accuracy);
  events.emit("done", d);
  say(res.reached ? "reached masked-LM accuracy " + std::to_string(res.final_mlm_accuracy) + " >= target " +
                        std::to_string(cfg.target.mlm_accuracy) + " after " + std::to_string(res.samples_to_target) +
                        " samples, " + fmt_duration(res.seconds_to_target)
                  : "target " + std::to_string(cfg.target.mlm_accuracy) + " not reached within " +
                        std::to_string(cfg.target.max_samples) + " samples (final accuracy " +
                        std::to_string(res.final_mlm_accuracy) + ")");
  if (!opt.dump_params.empty() && lead) write_params(opt.dump_params, model);
  if (!cfg.checkpoint.dir.empty()) save();
  comm->barrier();
  return res;
}

}  // namespace bs
