// A generated bad-input campaign against the real CLI: a few hundred cases (every training key with values of
// the wrong type, out of range, non-finite or past int64; damaged shards, vocabs and datasets; damaged study
// files; damaged checkpoints; paths that are folders, FIFOs or missing; bad `data prepare` flags; search
// spaces with values their key refuses). Every case must end within its time bound, with its documented
// exit code, a message naming what is wrong, no LibTorch backtrace, and nothing it did not create changed:
// a finished study, a prepared dataset and an unrelated file are fingerprinted before and after every case.
// The counts printed at the end are the ones RELIABILITY.md reports.
//
// The campaign runs as kShards test cases (Shards/Campaign.<name>/0..3) so that `ctest -j` can run them beside
// other tests. Every shard generates the whole, deterministic list of cases and runs its own share of it:
// cases are dealt round-robin, except that cases sharing a prepared input (the two cases of a damaged dataset,
// the damaged checkpoint sets made from one training run) form a group that goes to one shard, so each input
// is still prepared once. Each shard has its own finished study, dataset and unrelated file (SetUp) and
// prints its own counts: the shards' counts add up to the campaign's.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <yaml-cpp/yaml.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "ReliabilityUtil.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "dataset/ShardIO.h"

using namespace bs;
namespace fs = std::filesystem;

namespace {

struct Case {
  std::string name;
  std::vector<std::string> argv;  // without the binary
  int expected;                   // the documented exit code
  std::string needle;             // must appear in stderr
  double timeout_s = 60;
  // Cases with the same group run in the same shard; prepare (if set) makes the inputs the case reads, and is
  // called only in the case's shard, before any case of the shard runs.
  std::string group = {};
  std::function<::testing::AssertionResult()> prepare = {};
  int shard = -1;
};

constexpr int kShards = 4;

struct Tally {
  int cases = 0, as_documented = 0, wrong_code = 0, hangs = 0, backtraces = 0, unnamed = 0, destroyed = 0;
};

class Campaign : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    const auto setup_start = std::chrono::steady_clock::now();
    dir_ = test::make_temp_dir("rel-campaign");
    data_ = dir_ + "/data";
    fs::copy(test::small_brown_dataset(), data_, fs::copy_options::recursive);
    std::ofstream(dir_ + "/precious.txt") << "someone's notes";
    auto r = test::run(test::smoke_study(dir_ + "/studies", "kept",
                                         {"n_trials=1", "parallel=1", "base.target.max_samples=64",
                                          "base.target.eval_every_samples=32", "base.data.eval_samples=32"}),
                       300);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    tiny_ = dir_ + "/tiny.yaml";
    std::ofstream(tiny_) << "extends: " << test::source_dir() << "/configs/train/bert-tiny-brown.yaml\n"
                         << "data: {dir: " << data_ << ", eval_samples: 32}\n"
                         << "target: {max_samples: 32, eval_every_samples: 32}\n"
                         << "batch: {global: 16, micro: 16}\nthreads: 1\nprecision: fp32\n";
    setup_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - setup_start).count();
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string protected_fingerprint() const {
    return test::folder_fingerprint(dir_ + "/studies/kept") + test::folder_fingerprint(data_) +
           test::read_file(dir_ + "/precious.txt");
  }

  void run_case(const Case& c, Tally& t) {
    const std::string before = protected_fingerprint();
    std::vector<std::string> argv = {test::bertsweep_bin()};
    argv.insert(argv.end(), c.argv.begin(), c.argv.end());
    const auto start = std::chrono::steady_clock::now();
    auto r = test::run(argv, c.timeout_s);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    ++t.cases;
    bool ok = true;
    if (took >= c.timeout_s - 0.5) {
      ++t.hangs;
      ok = false;
      ADD_FAILURE() << c.name << ": still running after " << c.timeout_s << " s";
    }
    for (const char* trace : {"frame #", "Exception raised from", "(no backtrace available)"})
      if (r.err.find(trace) != std::string::npos) {
        ++t.backtraces;
        ok = false;
        ADD_FAILURE() << c.name << ": a backtrace reached the user:\n" << r.err.substr(0, 800);
        break;
      }
    if (r.exit_code != c.expected) {
      ++t.wrong_code;
      ok = false;
      ADD_FAILURE() << c.name << ": exit " << r.exit_code << ", documented " << c.expected << "\n"
                    << r.err.substr(0, 800);
    }
    if (r.err.find(c.needle) == std::string::npos) {
      ++t.unnamed;
      ok = false;
      ADD_FAILURE() << c.name << ": the message does not name '" << c.needle << "':\n" << r.err.substr(0, 800);
    }
    if (protected_fingerprint() != before) {
      ++t.destroyed;
      ok = false;
      ADD_FAILURE() << c.name << ": changed the study, the dataset or an unrelated file";
    }
    t.as_documented += ok;
  }

  // A copy of the dataset with one change, for shard cases: returns its folder.
  std::string damaged_copy(const std::string& name, const std::function<void(const std::string&)>& damage) {
    const std::string d = dir_ + "/bad-" + name;
    fs::copy(data_, d, fs::copy_options::recursive);
    damage(d);
    return d;
  }

  std::string dir_, data_, tiny_;
  double setup_s_ = 0;
};

// The key's type from the default config's YAML: int, double, bool, enum string, free string or list.
std::string kind_of(const std::string& key, const YAML::Node& defaults) {
  static const std::set<std::string> enums = {
      "data.sampler",        "optimizer.name",         "schedule.name", "clip.mode",
      "distributed.backend", "distributed.grad_dtype", "device",        "precision"};
  if (enums.count(key)) return "enum";
  const std::string text = yaml::scalar_at(defaults, key);
  if (key == "data.strata") return "int_list";
  if (key == "optimizer.no_decay") return "str_list";
  if (text == "true" || text == "false") return "bool";
  if (text.empty() || text.find_first_not_of("-0123456789.e+") != std::string::npos) return "string";
  if (text.find_first_of(".e") != std::string::npos) return "double";
  return "int";
}

// Integer keys whose default is written without a fraction but that are numbers (doubles) in the schema.
const std::set<std::string> kDoubleKeys = {
    "optimizer.lr",           "optimizer.beta1",    "optimizer.beta2",          "optimizer.eps",
    "optimizer.weight_decay", "optimizer.momentum", "schedule.warmup_fraction", "schedule.power",
    "schedule.end_lr",        "clip.max_norm",      "clip.bucket_mb",           "distributed.timeout_s",
    "target.mlm_accuracy",    "model.dropout"};

}  // namespace

TEST_P(Campaign, HundredsOfBadInputsEndCleanlyWithTheirDocumentedCode) {
  const int shard = GetParam();
  const auto budget_start = std::chrono::steady_clock::now();
  std::vector<Case> cases;
  auto config_case = [&](const std::string& key, const std::string& value) {
    cases.push_back({"--set " + key + "=" + value,
                     {"train", "--config", tiny_, "--set", key + "=" + value, "--print-config"},
                     exit_code::kUsage,
                     key});
  };
  // 1. Every training key, with values its type or range refuses.
  const YAML::Node defaults = TrainConfig().to_yaml();
  for (const auto& key : TrainConfig::keys()) {
    std::string kind = kDoubleKeys.count(key) ? "double" : kind_of(key, defaults);
    std::vector<std::string> bad;
    if (kind == "int")
      bad = {"abc", "1.5", "99999999999999999999", "-9223372036854775809", "[1, 2]", "{a: 1}", "-5", "nan"};
    if (kind == "double") bad = {"abc", "nan", "inf", "-inf", "1e999", "[0.1]", "-5"};
    if (kind == "bool") bad = {"maybe", "2", "[true]"};
    if (kind == "enum") bad = {"bogus", "[adam]", "ADAM_"};
    if (kind == "int_list") bad = {"abc", "[a, b]", "[1.5]", "[64, 32]", "[0]"};
    if (kind == "str_list") bad = {"abc", "{a: 1}"};
    for (const auto& v : bad) config_case(key, v);
  }
  // Keys that do not exist, and consistency between keys.
  for (const char* k : {"optimizer.lrr", "model.hiden", "batch.size", "threds", "precison", "data.sampler.kind"})
    cases.push_back({std::string("unknown key ") + k,
                     {"train", "--config", tiny_, "--set", std::string(k) + "=1", "--print-config"},
                     exit_code::kUsage,
                     k});
  cases.push_back({"micro > global",
                   {"train", "--config", tiny_, "--set", "batch.micro=64", "--print-config"},
                   exit_code::kUsage,
                   "batch.micro"});
  cases.push_back({"heads not dividing hidden",
                   {"train", "--config", tiny_, "--set", "model.heads=3", "--print-config"},
                   exit_code::kUsage,
                   "model.heads"});
  cases.push_back({"seq_len above max_position",
                   {"train", "--config", tiny_, "--set", "model.max_position=64", "--print-config"},
                   exit_code::kUsage,
                   "max_position"});
  cases.push_back(
      {"threads above the cores", {"train", "--config", tiny_, "--set", "threads=1000"}, exit_code::kUsage, "threads"});
  cases.push_back({"model too large for memory",
                   {"train", "--config", tiny_, "--set", "model.hidden=16384", "--set", "model.layers=512", "--set",
                    "model.heads=16"},
                   exit_code::kUsage,
                   "GiB"});
  cases.push_back({"device cuda", {"train", "--config", tiny_, "--set", "device=cuda"}, exit_code::kUsage, "device"});
  cases.push_back(
      {"fp16 on the CPU", {"train", "--config", tiny_, "--set", "precision=fp16"}, exit_code::kUsage, "precision"});

  // 2. Config files that are not files, or not YAML.
  fs::create_directories(dir_ + "/a-folder");
  mkfifo((dir_ + "/a-fifo").c_str(), 0644);
  std::ofstream(dir_ + "/dupe.yaml") << "extends: " << tiny_ << "\nseed: 1\nseed: 2\n";
  std::ofstream(dir_ + "/list.yaml") << "- a\n- b\n";
  std::ofstream(dir_ + "/broken.yaml") << "model: {hidden: [1, 2\n";
  std::ofstream(dir_ + "/extends-folder.yaml") << "extends: a-folder\n";
  std::ofstream(dir_ + "/extends-missing.yaml") << "extends: nowhere.yaml\n";
  for (const auto& [name, needle] :
       std::vector<std::pair<std::string, std::string>>{{"a-folder", "folder"},
                                                        {"a-fifo", "not a regular file"},
                                                        {"missing.yaml", "not found"},
                                                        {"dupe.yaml", "twice"},
                                                        {"list.yaml", "mapping"},
                                                        {"broken.yaml", "broken.yaml"},
                                                        {"extends-folder.yaml", "folder"},
                                                        {"extends-missing.yaml", "nowhere.yaml"}}) {
    cases.push_back(
        {"train --config " + name, {"train", "--config", dir_ + "/" + name}, exit_code::kUsage, needle, 30});
    if (name == "a-folder" || name == "a-fifo" || name == "missing.yaml" || name == "dupe.yaml" ||
        name == "broken.yaml")
      cases.push_back({"study run --config " + name,
                       {"study", "run", "--config", dir_ + "/" + name, "--dir", dir_ + "/studies"},
                       exit_code::kUsage,
                       needle,
                       30});
  }

  // 2b. A few hundred bytes of nested aliases ("billion laughs"), refused from the parser's events within a
  // second (the timeout); output paths that cannot be written, refused before any training.
  {
    std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n";
    for (char c = 'b'; c <= 'i'; ++c) {
      bomb += std::string(1, c) + ": &" + c + " [";
      for (int i = 0; i < 9; ++i) bomb += std::string(i ? ", " : "") + "*" + static_cast<char>(c - 1);
      bomb += "]\n";
    }
    std::ofstream(dir_ + "/bomb.yaml") << bomb;
    cases.push_back({"train --config bomb.yaml",
                     {"train", "--config", dir_ + "/bomb.yaml"},
                     exit_code::kUsage,
                     "billion laughs",
                     10});
    cases.push_back({"study run --config bomb.yaml",
                     {"study", "run", "--config", dir_ + "/bomb.yaml", "--dir", dir_ + "/studies"},
                     exit_code::kUsage,
                     "billion laughs",
                     10});
  }
  for (const auto& [what, extra, needle] : std::vector<std::tuple<std::string, std::vector<std::string>, std::string>>{
           {"--dump-params into a missing folder", {"--dump-params", "/nonexistent-bs/p.bin"}, "does not exist"},
           {"--dump-params onto a folder", {"--dump-params", dir_}, "is a folder"},
           {"--dump-params under a file", {"--dump-params", dir_ + "/tiny.yaml/p.bin"}, "is a file, not a folder"},
           {"checkpoint.dir onto a file", {"--set", "checkpoint.dir=" + dir_ + "/tiny.yaml"}, "checkpoint.dir"},
           {"checkpoint.dir under a file", {"--set", "checkpoint.dir=" + dir_ + "/tiny.yaml/ckpt"}, "checkpoint.dir"},
           {"log.mllog into a missing folder", {"--set", "log.mllog=/nonexistent-bs/m.log"}, "log.mllog"},
           {"--events onto a folder", {"--events", dir_}, "--events"},
       }) {
    std::vector<std::string> argv = {"train", "--config", tiny_};
    argv.insert(argv.end(), extra.begin(), extra.end());
    cases.push_back({"train " + what, argv, exit_code::kUsage, needle, 60});
  }

  // 3. Damaged data: each case is validated by `data inspect --check` and refused by `train` with exit 3.
  auto with_shard = [&](const std::string& dirpath, const std::string& file,
                        const std::function<void(ShardData&)>& change) {
    ShardData d = read_shard(dirpath + "/" + file);
    change(d);
    write_shard(dirpath + "/" + file, d);
  };
  std::vector<std::tuple<std::string, std::function<void(const std::string&)>, std::string>> damages = {
      {"negative-input-id",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.input_ids[3][5] = -1; }); },
       "input_ids"},
      {"input-id-past-vocab",
       [&](const std::string& d) {
         with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.input_ids[3][5] = 999999; });
       },
       "input_ids"},
      {"segment-2",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.segment_ids[1][2] = 2; }); },
       "segment_ids"},
      {"segment-negative",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.segment_ids[1][2] = -1; }); },
       "segment_ids"},
      {"nsp-label-2",
       [&](const std::string& d) {
         with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.next_sentence_labels[4] = 2; });
       },
       "next_sentence_labels"},
      {"masked-id-negative",
       [&](const std::string& d) {
         with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.masked_lm_ids[0][0] = -3; });
       },
       "masked_lm_ids"},
      {"masked-position-past-seq",
       [&](const std::string& d) {
         with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.masked_lm_positions[0][0] = 4096; });
       },
       "masked_lm_positions"},
      {"mask-value-7",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.input_mask[2][0] = 7; }); },
       "input_mask"},
      {"all-zero-mask",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.input_mask[2].zero_(); }); },
       "input_mask"},
      // Values in range, structure impossible (check_shard_structure): each trained to accuracy 0 before.
      {"all-pad-input-ids",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.input_ids.zero_(); }); },
       "never id 0"},
      {"input-mask-hole",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.input_mask[2][1] = 0; }); },
       "no hole"},
      {"masked-positions-all-zero",
       [&](const std::string& d) {
         with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.masked_lm_positions.zero_(); });
       },
       "after [CLS]"},
      {"masked-ids-all-zero",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.masked_lm_ids.zero_(); }); },
       "masked_lm_positions"},
      {"segments-all-one",
       [&](const std::string& d) { with_shard(d, "train_00000.hdf5", [](ShardData& s) { s.segment_ids.fill_(1); }); },
       "segment_ids"},
      {"eval-segment-2",
       [&](const std::string& d) { with_shard(d, "eval.hdf5", [](ShardData& s) { s.segment_ids[0][1] = 2; }); },
       "eval.hdf5"},
      {"truncated-shard",
       [](const std::string& d) {
         fs::resize_file(d + "/train_00000.hdf5", fs::file_size(d + "/train_00000.hdf5") / 3);
       },
       "train_00000.hdf5"},
      {"zero-byte-shard", [](const std::string& d) { fs::resize_file(d + "/train_00000.hdf5", 0); },
       "train_00000.hdf5"},
      {"missing-shard", [](const std::string& d) { fs::remove(d + "/train_00000.hdf5"); }, "train_00000.hdf5"},
      {"missing-eval", [](const std::string& d) { fs::remove(d + "/eval.hdf5"); }, "eval.hdf5"},
      {"vocab-without-mask",
       [](const std::string& d) {
         std::ifstream in(d + "/vocab.txt");
         std::string all, line;
         while (std::getline(in, line)) all += (line == "[MASK]" ? "[MASQUE]" : line) + "\n";
         in.close();
         std::ofstream(d + "/vocab.txt") << all;
       },
       "[MASK]"},
      {"meta-count-mismatch",
       [](const std::string& d) {
         std::string meta = test::read_file(d + "/meta.yaml");
         auto at = meta.find("train_instances: ");
         meta.insert(at + 17, "9");
         std::ofstream(d + "/meta.yaml") << meta;
       },
       "meta.yaml"},
  };
  std::set<std::string> damaged_made;
  for (const auto& [name, damage, needle] : damages) {
    const std::string d = dir_ + "/bad-" + name;  // what damaged_copy makes
    auto make = [&, name = name, damage = damage]() -> ::testing::AssertionResult {
      if (damaged_made.insert(name).second) damaged_copy(name, damage);
      return ::testing::AssertionSuccess();
    };
    cases.push_back({"data inspect --check " + name,
                     {"data", "inspect", d, "--check"},
                     exit_code::kData,
                     needle,
                     60,
                     "data " + name,
                     make});
    cases.push_back({"train on " + name,
                     {"train", "--config", tiny_, "--set", "data.dir=" + d},
                     exit_code::kData,
                     needle,
                     120,
                     "data " + name,
                     make});
  }

  // 4. `data prepare` flags out of range, and outputs it must not replace.
  const std::vector<std::string> prep = {"data",         "prepare", "--corpus",   "brown",
                                         "--vocab-size", "500",     "--max-docs", "20"};
  auto prepare_case = [&](const std::string& name, std::vector<std::string> extra, const std::string& needle) {
    std::vector<std::string> argv = prep;
    argv.insert(argv.end(), extra.begin(), extra.end());
    cases.push_back({"data prepare " + name, argv, exit_code::kUsage, needle, 120});
  };
  prepare_case("--seq-len 2147483648", {"--seq-len", "2147483648", "--out", dir_ + "/p1"}, "--seq-len");
  prepare_case("--seq-len 99999999999999999999", {"--seq-len", "99999999999999999999", "--out", dir_ + "/p1"},
               "--seq-len");
  prepare_case("--dupe-factor 1000000000", {"--dupe-factor", "1000000000", "--out", dir_ + "/p1"}, "--dupe-factor");
  prepare_case("--masked-lm-prob nan", {"--masked-lm-prob", "nan", "--out", dir_ + "/p1"}, "--masked-lm-prob");
  prepare_case("--short-seq-prob -0.5", {"--short-seq-prob", "-0.5", "--out", dir_ + "/p1"}, "--short-seq-prob");
  prepare_case("--max-predictions 0", {"--max-predictions", "0", "--out", dir_ + "/p1"}, "--max-predictions");
  prepare_case("--vocab-size 2000000000", {"--vocab-size", "2000000000", "--out", dir_ + "/p1"}, "--vocab-size");
  prepare_case("--force over a folder of notes", {"--out", dir_, "--force"}, "not a dataset");
  prepare_case("--force over a file", {"--out", dir_ + "/precious.txt", "--force"}, "not a folder");
  prepare_case("--force over a FIFO", {"--out", dir_ + "/a-fifo", "--force"}, "not a folder");
  prepare_case("--out a dataset without --force", {"--out", data_}, "--force");

  // 5. Damaged study files, and outputs inside a study: exit 7, the file left as it was (checked per case
  // for the kept study; the damaged ones are compared below).
  const std::string db = dir_ + "/studies/kept/study.db";
  std::vector<std::pair<std::string, std::function<void(const std::string&)>>> study_damages = {
      {"zero", [](const std::string& p) { std::ofstream(p).close(); }},
      {"random",
       [](const std::string& p) {
         std::mt19937 g(3);
         std::ofstream o(p, std::ios::binary);
         for (int i = 0; i < 8192; ++i) o.put(static_cast<char>(g() & 0xff));
       }},
      {"truncated",
       [&](const std::string& p) {
         fs::copy_file(db, p);
         fs::resize_file(p, 2048);  // half of the first page
       }},
      {"foreign",
       [](const std::string& p) {
         std::ofstream o(p, std::ios::binary);
         o << "SQLite format 3";
         o.put('\0');
         for (int i = 0; i < 4000; ++i) o.put('\0');
       }},
  };
  std::map<std::string, std::string> damaged_bytes;
  for (const auto& [name, make] : study_damages) {
    fs::create_directories(dir_ + "/studies/" + name);
    make(dir_ + "/studies/" + name + "/study.db");
    damaged_bytes[name] = test::read_file(dir_ + "/studies/" + name + "/study.db");
    for (std::vector<std::string> cmd : {std::vector<std::string>{"study", "status", name},
                                         {"study", "resume", name},
                                         {"study", "export", name, "--best"},
                                         {"study", "confirm", name, "--seeds", "1"},
                                         {"report", name, "--out", dir_ + "/report-" + name}}) {
      cmd.insert(cmd.end(), {"--dir", dir_ + "/studies"});
      cases.push_back({cmd[0] + " " + cmd[1] + " on a " + name + " study.db", cmd, exit_code::kStudy, "study.db"});
    }
  }
  for (const std::string& out : {db, db + "-wal", dir_ + "/studies/kept/trials/x.yaml", dir_ + "/studies/kept/y.yaml"})
    cases.push_back({"export --out " + out,
                     {"study", "export", "kept", "--dir", dir_ + "/studies", "--out", out},
                     exit_code::kStudy,
                     out});
  cases.push_back({"report --out inside the study",
                   {"report", "kept", "--dir", dir_ + "/studies", "--out", dir_ + "/studies/kept/r"},
                   exit_code::kStudy,
                   "inside the study folder"});
  for (const char* name : {"../kept", "kept/..", "a b", "", ".."})
    for (const char* sub : {"status", "export"})
      cases.push_back({std::string("study ") + sub + " name '" + name + "'",
                       {"study", sub, name, "--dir", dir_ + "/studies"},
                       std::string(sub) == "status" ? 2 : 7,
                       "study name"});

  // 6. Search spaces with values their key refuses: refused before the first trial.
  auto space_case = [&](const std::string& name, const std::string& space) {
    const std::string path = dir_ + "/space-" + std::to_string(cases.size()) + ".yaml";
    std::ofstream(path) << "name: space\nobjective: samples_to_target\nsampler: random\nn_trials: 2\n"
                        << "base:\n  extends: " << tiny_ << "\nspace:\n"
                        << space;
    cases.push_back({"space " + name,
                     {"study", "run", "--config", path, "--dir", dir_ + "/space-studies"},
                     exit_code::kUsage,
                     name.substr(0, name.find(' '))});
  };
  space_case("optimizer.name rmsprop", "  optimizer.name: {choice: [adamw, rmsprop]}\n");
  space_case("batch.global 0 and -16", "  batch.global: {choice: [0, -16]}\n");
  space_case("optimizer.lr negative", "  optimizer.lr: {uniform: [-1.0, 1.0]}\n");
  space_case("optimizer.beta2 above 1", "  optimizer.beta2: {uniform: [0.9, 1.5]}\n");
  space_case("clip.mode unknown", "  clip.mode: {choice: [none, sometimes]}\n");
  space_case("model.dropout 1", "  model.dropout: {choice: [0.0, 1.0]}\n");
  space_case("precision fp8", "  precision: {choice: [fp32, fp8]}\n");
  space_case("data.sampler typo", "  data.sampler: {choice: [random, local_presrot]}\n");
  space_case("schedule.warmup_steps -7", "  schedule.warmup_steps: {int: [-7, 10]}\n");
  space_case("threads huge", "  threads: {choice: [1, 100000]}\n");

  // 7. Damaged checkpoints: resume refuses them with exit 3 naming the file.
  const std::string ck = dir_ + "/ck";
  bool ck_trained = false;
  auto train_once = [&]() -> ::testing::AssertionResult {
    if (ck_trained) return ::testing::AssertionSuccess();
    auto first =
        test::run({test::bertsweep_bin(), "train", "--config", tiny_, "--set", "checkpoint.dir=" + ck, "--quiet"}, 180);
    if (first.exit_code != 0)
      return ::testing::AssertionFailure()
             << "the training run for the checkpoint cases: exit " << first.exit_code << "\n"
             << first.err;
    ck_trained = true;
    return ::testing::AssertionSuccess();
  };
  // The set's files are named by step: find them.
  auto file_in = [](const std::string& d, const std::string& prefix) {
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().filename().string().rfind(prefix, 0) == 0) return e.path().string();
    return d + "/" + prefix + "-missing";
  };
  std::vector<std::tuple<std::string, std::function<void(const std::string&)>, std::string>> ck_damages = {
      {"random-checkpoint",
       [&](const std::string& d) {
         std::mt19937 g(9);
         std::ofstream o(file_in(d, "checkpoint-"), std::ios::binary);
         for (int i = 0; i < 4096; ++i) o.put(static_cast<char>(g() & 0xff));
       },
       "checkpoint-"},
      {"flipped-byte",
       [&](const std::string& d) {
         std::fstream f(file_in(d, "checkpoint-"), std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(1000);
         f.put('\x5a');
       },
       "checkpoint-"},
      {"truncated-rng", [&](const std::string& d) { fs::resize_file(file_in(d, "rng-"), 10); }, "-rank0.pt"},
      {"missing-rng", [&](const std::string& d) { fs::remove(file_in(d, "rng-")); }, "-rank0.pt"},
      {"missing-model", [&](const std::string& d) { fs::remove(file_in(d, "checkpoint-")); }, "checkpoint-"},
      {"missing-manifest", [](const std::string& d) { fs::remove(d + "/checksums.txt"); }, "checksums.txt"},
      {"damaged-manifest",
       [](const std::string& d) {
         std::string m = test::read_file(d + "/checksums.txt");
         m[3] = 'z';
         std::ofstream(d + "/checksums.txt") << m;
       },
       "checksums.txt"},
  };
  for (const auto& [name, damage, needle] : ck_damages) {
    const std::string d = dir_ + "/ck-" + name;
    auto make = [&, d, damage = damage]() -> ::testing::AssertionResult {
      auto trained = train_once();
      if (!trained) return trained;
      fs::copy(ck, d, fs::copy_options::recursive);
      damage(d);
      return ::testing::AssertionSuccess();
    };
    cases.push_back({"resume from " + name,
                     {"train", "--config", tiny_, "--set", "checkpoint.dir=" + d, "--resume"},
                     exit_code::kData,
                     needle,
                     120,
                     "checkpoint",
                     make});
  }

  // Deal the cases: round-robin over groups, a case without a group being a group of its own.
  std::map<std::string, int> group_shard;
  int dealt = 0;
  for (auto& c : cases) {
    if (c.group.empty()) {
      c.shard = dealt++ % kShards;
      continue;
    }
    auto [at, fresh] = group_shard.emplace(c.group, dealt % kShards);
    dealt += fresh;
    c.shard = at->second;
  }
  std::vector<const Case*> mine;
  for (const auto& c : cases)
    if (c.shard == shard) mine.push_back(&c);
  const auto prepare_start = std::chrono::steady_clock::now();
  for (const Case* c : mine) {
    if (c->prepare) {
      ASSERT_TRUE(c->prepare()) << c->name;
    }
  }
  const double prepare_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - prepare_start).count();

  Tally t;
  const auto cases_start = std::chrono::steady_clock::now();
  for (const Case* c : mine) run_case(*c, t);
  const double cases_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - cases_start).count();
  for (const auto& [name, bytes] : damaged_bytes)
    if (test::read_file(dir_ + "/studies/" + name + "/study.db") != bytes) {
      ++t.destroyed;
      ADD_FAILURE() << "the " << name << " study.db was changed by a command that refused it";
    }
  const double minutes = std::chrono::duration<double>(std::chrono::steady_clock::now() - budget_start).count() / 60.0;
  std::cout << "bad-input campaign shard " << shard << " of " << kShards << " (of " << cases.size()
            << " cases in all; the shards' counts add up): " << t.cases << " cases in " << minutes
            << " min: " << t.as_documented << " as documented, " << t.wrong_code << " wrong exit code, " << t.unnamed
            << " message not naming it, " << t.backtraces << " backtraces, " << t.hangs << " hangs, " << t.destroyed
            << " destroyed data\n"
            << "  set-up " << setup_s_ << " s (dataset copy + 1-trial study), inputs " << prepare_s << " s, cases "
            << cases_s << " s\n";
  EXPECT_GE(cases.size(), 300u);  // the whole campaign, whichever shard counts it
  EXPECT_EQ(t.cases, static_cast<int>(mine.size()));
  // A fair share: round-robin over groups leaves no shard short by more than the largest group (7 cases).
  EXPECT_GE(t.cases, static_cast<int>(cases.size()) / kShards - 8);
  EXPECT_EQ(t.as_documented, t.cases);
}

INSTANTIATE_TEST_SUITE_P(Shards, Campaign, ::testing::Range(0, kShards));
