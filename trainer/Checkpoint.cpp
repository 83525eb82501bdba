#include "trainer/Checkpoint.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include "distributed/Communicator.h"
#include "dataset/ShardIO.h"

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

// Every save writes a new set named by its step and publishes it by renaming checksums.txt over the old
// manifest; the previous set is deleted only after that. A kill at any moment leaves a complete set that the
// manifest describes (the old one until the rename, the new one after).
std::string model_name(int64_t step) { return "checkpoint-" + std::to_string(step) + ".pt"; }
std::string rng_name(int64_t step, int64_t rank) {
  return "rng-" + std::to_string(step) + "-rank" + std::to_string(rank) + ".pt";
}

// One line per file: "<fnv1a64 hex> <bytes> <name>"; a set whose files do not all match it (a damaged or
// replaced file) is refused instead of resumed.
constexpr const char* kManifest = "checksums.txt";

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

struct ManifestEntry {
  uint64_t hash = 0;
  uint64_t bytes = 0;
};

// The file of the manifest whose name starts with `prefix` and ends with `suffix`, or "".
std::string listed(const std::map<std::string, ManifestEntry>& m, const std::string& prefix,
                   const std::string& suffix) {
  for (const auto& kv : m)
    if (kv.first.rfind(prefix, 0) == 0 && kv.first.size() >= prefix.size() + suffix.size() &&
        kv.first.compare(kv.first.size() - suffix.size(), suffix.size(), suffix) == 0)
      return kv.first;
  return "";
}

std::map<std::string, ManifestEntry> read_manifest(const fs::path& dir) {
  const fs::path path = dir / kManifest;
  std::ifstream in(path);
  if (!in)
    throw DataError(path.string() + " is missing: the checkpoint set in " + dir.string() +
                    " is incomplete (a run killed while writing it, or an older bertsweep); start a fresh "
                    "checkpoint.dir or remove --resume");
  std::map<std::string, ManifestEntry> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::string hash, name;
    ManifestEntry e;
    if (!(ss >> hash >> e.bytes >> name) || hash.size() != 16 ||
        hash.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw DataError(path.string() + ": damaged line '" + line.substr(0, 80) + "'");
    e.hash = std::stoull(hash, nullptr, 16);
    out[name] = e;
  }
  return out;
}

void verify(const fs::path& dir, const std::map<std::string, ManifestEntry>& manifest, const std::string& name) {
  const fs::path path = dir / name;
  auto it = manifest.find(name);
  if (it == manifest.end())
    throw DataError(path.string() + " is not listed in " + (dir / kManifest).string() +
                    ": the checkpoint set is incomplete (written by another number of ranks?)");
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw DataError(path.string() + " is missing from the checkpoint set (listed in " + (dir / kManifest).string() +
                    ")");
  const uint64_t bytes = fs::file_size(path, ec);
  if (bytes != it->second.bytes || file_checksum(path.string()) != it->second.hash)
    throw DataError(
        path.string() + " does not match its checksum in " + (dir / kManifest).string() + " (" + std::to_string(bytes) +
        " bytes, expected " + std::to_string(it->second.bytes) +
        "): the checkpoint is damaged or incomplete; resume from a good copy or start a fresh checkpoint.dir");
}
}  // namespace

uint64_t file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError("cannot read " + path);
  uint64_t h = 1469598103934665603ULL;  // FNV-1a 64
  std::vector<char> buf(1 << 20);
  while (in) {
    in.read(buf.data(), static_cast<std::streamsize>(buf.size()));
    const std::streamsize n = in.gcount();
    for (std::streamsize i = 0; i < n; ++i) {
      h ^= static_cast<unsigned char>(buf[i]);
      h *= 1099511628211ULL;
    }
  }
  return h;
}

void save_checkpoint(const std::string& dir, int64_t rank, int64_t world, BertForPretraining& model,
                     optim::Optimizer& optimizer, const TrainState& state, Communicator& comm) {
  fs::create_directories(dir);
  torch::NoGradGuard no_grad;
  const fs::path own = fs::path(dir) / rng_name(state.step, rank);
  {
    torch::serialize::OutputArchive rng;
    rng.write("generator", at::detail::getDefaultCPUGenerator().get_state());
    // On a GPU, dropout draws from the device's generator.
    const torch::Device device = model->parameters().front().device();
    if (device.is_cuda()) rng.write("cuda_generator", at::globalContext().defaultGenerator(device).get_state());
    atomic_save(rng, own);
  }
  // Each rank hashes its own RNG file (ranks may not share a filesystem view); rank 0 lists them all.
  const uint64_t own_hash = file_checksum(own.string());
  const auto hashes =
      comm.allgather({double(own_hash >> 32), double(own_hash & 0xffffffffULL), double(fs::file_size(own))});
  std::string failure;
  if (rank == 0) {
    try {
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
      const fs::path ckpt = fs::path(dir) / model_name(state.step);
      atomic_save(ar, ckpt);
      std::ostringstream manifest;
      manifest << hex64(file_checksum(ckpt.string())) << " " << fs::file_size(ckpt) << " " << model_name(state.step)
               << "\n";
      for (int64_t r = 0; r < world; ++r) {
        const uint64_t h = (uint64_t(hashes[r * 3]) << 32) | uint64_t(hashes[r * 3 + 1]);
        manifest << hex64(h) << " " << uint64_t(hashes[r * 3 + 2]) << " " << rng_name(state.step, r) << "\n";
      }
      const fs::path tmp = fs::path(dir) / (std::string(kManifest) + ".tmp");
      {
        std::ofstream out(tmp);
        out << manifest.str();
        out.flush();
        if (!out) throw DataError("cannot write " + tmp.string() + " (disk full?)");
      }
      fs::rename(tmp, fs::path(dir) / kManifest);  // publishes the new set
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  // Every rank learns whether the set was published (a failing rank 0 must not leave the others waiting).
  const auto ok = comm.allgather({failure.empty() ? 1.0 : 0.0});
  if (ok[0] == 0)
    throw DataError("checkpoint in " + dir + " not written: " + (failure.empty() ? "rank 0 failed" : failure));
  // The previous sets are garbage now: each rank removes its own files, rank 0 the model files.
  std::error_code ec;
  const std::string keep_model = model_name(state.step), keep_rng = rng_name(state.step, rank);
  const std::string own_suffix = "-rank" + std::to_string(rank) + ".pt";
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    const bool old_model = rank == 0 && name.rfind("checkpoint-", 0) == 0 && name != keep_model;
    const bool old_rng = name.rfind("rng-", 0) == 0 && name != keep_rng && name.size() > own_suffix.size() &&
                         name.compare(name.size() - own_suffix.size(), own_suffix.size(), own_suffix) == 0;
    if (old_model || old_rng) fs::remove(e.path(), ec);
  }
}

bool load_checkpoint(const std::string& dir, int64_t rank, BertForPretraining& model, optim::Optimizer& optimizer,
                     TrainState& state) {
  std::error_code ec;
  bool any = fs::exists(fs::path(dir) / kManifest, ec);
  for (const auto& e : fs::directory_iterator(dir, ec))
    any = any || e.path().filename().string().rfind("checkpoint", 0) == 0;
  if (!any) return false;
  // The whole set is checked before anything is read: the model file and this rank's RNG state.
  const auto manifest = read_manifest(dir);
  const std::string model_file = listed(manifest, "checkpoint-", ".pt");
  if (model_file.empty()) throw DataError((fs::path(dir) / kManifest).string() + " lists no checkpoint-<step>.pt");
  const std::string step = model_file.substr(11, model_file.size() - 14);
  const std::string rng_file = "rng-" + step + "-rank" + std::to_string(rank) + ".pt";
  verify(dir, manifest, model_file);
  verify(dir, manifest, rng_file);
  const fs::path path = fs::path(dir) / model_file;
  torch::serialize::InputArchive ar;
  try {
    ar.load_from(path.string(), torch::Device(torch::kCPU));  // saved on any device, loaded on any
  } catch (const std::exception& e) {
    throw DataError(path.string() + ": not a readable bertsweep checkpoint (" + std::string(e.what()).substr(0, 200) +
                    ")");
  }
  torch::Tensor sig_t;
  ar.read("signature", sig_t);
  std::string sig(static_cast<const char*>(sig_t.data_ptr()), sig_t.numel());
  if (sig != model_signature(model))
    throw DataError(path.string() +
                    ": checkpoint is from a different model (parameter names or shapes differ); "
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
  // A fresh tensor per key: InputArchive::read into a defined tensor set_()s its storage, so a double read
  // into the int64 tensor of the key before came back as the int64 reinterpretation of its bits.
  auto scalar = [&](const char* key) {
    torch::Tensor t;
    ar.read(key, t);
    return t;
  };
  state.step = scalar("step").item<int64_t>();
  state.samples = scalar("samples").item<int64_t>();
  state.seconds = scalar("seconds").item<double>();
  state.last_accuracy = scalar("last_accuracy").item<double>();
  const fs::path rng_path = fs::path(dir) / rng_file;
  try {
    torch::serialize::InputArchive rng;
    rng.load_from(rng_path.string(), torch::Device(torch::kCPU));
    torch::Tensor g;
    rng.read("generator", g);
    at::Generator gen = at::detail::getDefaultCPUGenerator();  // shares the default generator
    gen.set_state(g);
    // A GPU run restores its device generator; a set saved on another device has none (or one this run
    // does not use): dropout then continues from a fresh stream, the weights are exact either way.
    const torch::Device device = model->parameters().front().device();
    torch::Tensor cg;
    if (device.is_cuda() && rng.try_read("cuda_generator", cg)) {
      at::Generator cuda_gen = at::globalContext().defaultGenerator(device);
      cuda_gen.set_state(cg);
    }
  } catch (const c10::Error& e) {
    throw DataError(rng_path.string() + ": not a readable RNG state (" + e.what_without_backtrace() + ")");
  }
  return true;
}

}  // namespace bs
