#include "trainer/Checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>

#include "trainer/Communicator.h"
#include "trainer/ShardIO.h"

namespace bs {
namespace fs = std::filesystem;

namespace {
std::string model_signature(BertForPretraining& model) {
  std::string sig;
  for (const auto& kv : model->named_parameters()) {
    sig += kv.key() + "[";
    for (auto s : kv.value().sizes()) sig += std::to_string(s) + ",";
    sig += "];";
  }
  return sig;
}

void atomic_save(torch::serialize::OutputArchive& ar, const fs::path& path) {
  fs::path tmp = path;
  tmp += ".tmp";
  ar.save_to(tmp.string());
  fs::rename(tmp, path);
}
}  // namespace

void save_checkpoint(const std::string& dir, int64_t rank, int64_t world, BertForPretraining& model,
                     optim::Optimizer& optimizer, const TrainState& state, Communicator& comm) {
  fs::create_directories(dir);
  torch::NoGradGuard no_grad;
  {
    torch::serialize::OutputArchive rng;
    rng.write("generator", at::detail::getDefaultCPUGenerator().get_state());
    atomic_save(rng, fs::path(dir) / ("rng_rank" + std::to_string(rank) + ".pt"));
  }
  comm.barrier();  // every rank's RNG is on disk before rank 0 publishes the checkpoint that refers to it
  if (rank == 0) {
    torch::serialize::OutputArchive ar;
    for (const auto& kv : model->named_parameters()) ar.write("param." + kv.key(), kv.value().detach());
    for (const auto& kv : model->named_buffers()) ar.write("buffer." + kv.key(), kv.value().detach());
    torch::serialize::OutputArchive opt;
    optimizer.save(opt);
    ar.write("optimizer", opt);
    ar.write("step", torch::tensor(state.step, torch::kInt64));
    ar.write("samples", torch::tensor(state.samples, torch::kInt64));
    ar.write("seconds", torch::tensor(state.seconds, torch::kFloat64));
    ar.write("last_accuracy", torch::tensor(state.last_accuracy, torch::kFloat64));
    ar.write("world", torch::tensor(world, torch::kInt64));
    std::string sig = model_signature(model);
    ar.write("signature", torch::from_blob(sig.data(), {static_cast<int64_t>(sig.size())}, torch::kChar).clone());
    atomic_save(ar, fs::path(dir) / "checkpoint.pt");
  }
  comm.barrier();
}

bool load_checkpoint(const std::string& dir, int64_t rank, BertForPretraining& model, optim::Optimizer& optimizer,
                     TrainState& state) {
  fs::path path = fs::path(dir) / "checkpoint.pt";
  if (!fs::exists(path)) return false;
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(path.string());
  } catch (const std::exception& e) {
    throw DataError(path.string() + ": not a readable bertsweep checkpoint (" + std::string(e.what()).substr(0, 200) +
                    ")");
  }
  torch::Tensor sig_t;
  ar.read("signature", sig_t);
  std::string sig(static_cast<const char*>(sig_t.data_ptr()), sig_t.numel());
  if (sig != model_signature(model))
    throw DataError(path.string() + ": checkpoint is from a different model (parameter names or shapes differ); "
                    "use the model config it was trained with, or a fresh checkpoint.dir");
  torch::NoGradGuard no_grad;
  for (const auto& kv : model->named_parameters()) {
    torch::Tensor t;
    ar.read("param." + kv.key(), t);
    kv.value().copy_(t);
  }
  for (const auto& kv : model->named_buffers()) {
    torch::Tensor t;
    ar.read("buffer." + kv.key(), t);
    kv.value().copy_(t);
  }
  torch::serialize::InputArchive opt;
  ar.read("optimizer", opt);
  optimizer.load(opt);
  torch::Tensor t;
  ar.read("step", t);
  state.step = t.item<int64_t>();
  ar.read("samples", t);
  state.samples = t.item<int64_t>();
  ar.read("seconds", t);
  state.seconds = t.item<double>();
  ar.read("last_accuracy", t);
  state.last_accuracy = t.item<double>();
  fs::path rng_path = fs::path(dir) / ("rng_rank" + std::to_string(rank) + ".pt");
  if (fs::exists(rng_path)) {
    torch::serialize::InputArchive rng;
    rng.load_from(rng_path.string());
    torch::Tensor g;
    rng.read("generator", g);
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default generator
    gen.set_state(g);
  }
  return true;
}

}  // namespace bs
