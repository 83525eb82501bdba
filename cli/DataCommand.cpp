// bertsweep data prepare|inspect: parse options, call trainer/PretrainingData and dataset/ShardIO.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"
#include "dataset/PretrainingData.h"
#include "dataset/ShardIO.h"

namespace bs::cli {
namespace fs = std::filesystem;
namespace {

const char* kDataUsage =
    R"(usage: bertsweep data prepare --corpus brown|DIR (--vocab FILE | --vocab-size N) --seq-len 128 --out DIR [options]
       bertsweep data inspect DIR|FILE.hdf5

Run `bertsweep data prepare --help` or `bertsweep data inspect --help` for details.
)";

const char* kPrepareUsage =
    R"(usage: bertsweep data prepare --corpus brown|DIR (--vocab FILE | --vocab-size N) --seq-len 128 --out DIR [options]

Makes BERT pretraining data (as BERT's create_pretraining_data) in MLPerf's HDF5 layout:
DIR/train_00000.hdf5 ..., DIR/eval.hdf5 (held-out documents, masks fixed), DIR/vocab.txt, DIR/meta.yaml.

  --corpus brown|DIR       brown: the Brown corpus fetched by scripts/fetch-corpus; DIR: plain-text files,
                           one sentence per line, a blank line between documents
  --vocab FILE             a BERT vocab.txt (with [PAD] [UNK] [CLS] [SEP] [MASK])
  --vocab-size N           or train a WordPiece vocab of N tokens on the training documents
  --seq-len N              sequence length (default 128)
  --out DIR                the dataset folder (built in DIR.tmp-XXXXXX, renamed when complete)
  --max-predictions N      masked positions per sequence (default 20; MLPerf uses 76 at 512)
  --dupe-factor N          passes over the corpus with different chunks and masks (default 5)
  --short-seq-prob P       chance of a shorter target length per document (default 0.1)
  --masked-lm-prob P       share of tokens masked (default 0.15)
  --seed N                 random seed (default 12345); the same seed gives identical files
  --max-docs N             use only the first N documents
  --eval-every K           hold out every K-th document for eval.hdf5 (default 20)
  --shard-size N           instances per training shard (default 50000)
  --force                  replace an existing --out
  --quiet                  no progress on stderr
)";

const char* kInspectUsage = R"(usage: bertsweep data inspect DIR|FILE.hdf5 [--check]

Shows each shard's shapes and sample count, the sequence-length histogram and masking / next-sentence
statistics. A DIR is read as a prepared dataset (train shards, eval.hdf5, vocab.txt) and validated exactly as
`bertsweep train` validates it before training: the shards meta.yaml lists present and their counts equal,
the vocab's special tokens, every value in range (token ids below the vocab size, segments, next-sentence
labels and mask in {0, 1}, masked positions inside the sequence, no all-padding sample).

  --check    validate only: print one line per file checked; exit 0 when valid, 3 (data error) otherwise
)";

double to_double(const Args& a, const std::string& name, double fallback) {
  if (!a.has(name)) return fallback;
  try {
    std::size_t n = 0;
    double v = std::stod(a.get(name), &n);
    if (n != a.get(name).size()) throw std::invalid_argument("trailing");
    return v;
  } catch (...) {
    throw UsageError("option --" + name + " must be a number, got '" + a.get(name) + "'");
  }
}

long long positive_int(const Args& a, const std::string& name, long long fallback, long long min = 1) {
  long long v = a.get_int(name, fallback);
  if (v < min)
    throw UsageError("option --" + name + " must be at least " + std::to_string(min) + ", got " + std::to_string(v));
  return v;
}

long long bounded_int(const Args& a, const std::string& name, long long fallback, long long min, long long max) {
  long long v = positive_int(a, name, fallback, min);
  if (v > max)
    throw UsageError("option --" + name + " must be at most " + std::to_string(max) + ", got " + std::to_string(v));
  return v;
}

int prepare(const Args& a) {
  if (a.has("help")) {
    std::cout << kPrepareUsage;
    return exit_code::kOk;
  }
  a.allow_only({"corpus", "vocab", "vocab-size", "seq-len", "out", "max-predictions", "dupe-factor", "short-seq-prob",
                "masked-lm-prob", "seed", "max-docs", "eval-every", "shard-size", "quiet", "force", "help"});
  if (!a.positional().empty()) throw UsageError("unexpected argument '" + a.positional().front() + "'");
  PrepareOptions o;
  o.corpus = a.require("corpus");
  o.out = a.require("out");
  if (a.has("vocab") == a.has("vocab-size")) throw UsageError("give exactly one of --vocab FILE and --vocab-size N");
  o.vocab_file = a.get("vocab");
  o.vocab_size = bounded_int(a, "vocab-size", 8192, 16, 1000000);
  o.pretraining.seq_len = bounded_int(a, "seq-len", 128, 8, 65536);
  o.pretraining.max_predictions = bounded_int(a, "max-predictions", 20, 1, o.pretraining.seq_len);
  o.pretraining.dupe_factor = bounded_int(a, "dupe-factor", 5, 1, 100);
  o.pretraining.short_seq_prob = to_double(a, "short-seq-prob", 0.1);
  o.pretraining.masked_lm_prob = to_double(a, "masked-lm-prob", 0.15);
  if (!(o.pretraining.short_seq_prob >= 0 && o.pretraining.short_seq_prob <= 1))  // NaN fails too
    throw UsageError("option --short-seq-prob must be in [0, 1]");
  if (!(o.pretraining.masked_lm_prob > 0 && o.pretraining.masked_lm_prob < 1))
    throw UsageError("option --masked-lm-prob must be in (0, 1)");
  o.seed = static_cast<uint64_t>(positive_int(a, "seed", 12345, 0));
  o.max_docs = positive_int(a, "max-docs", 0, 0);
  o.eval_every = bounded_int(a, "eval-every", 20, 2, 1000000);
  o.shard_size = bounded_int(a, "shard-size", 50000, 1, 100000000);
  o.force = a.has("force");
  const bool quiet = a.has("quiet");

  try {
    check_dataset_out(o.out, o.force);  // before the corpus is read: a refusal costs nothing
  } catch (const DataError& e) {
    throw UsageError(e.what());
  }

  auto progress = [quiet](const std::string& line) {
    if (!quiet) std::cerr << "data prepare: " << line << std::endl;
  };
  PrepareSummary s = prepare_pretraining_data(o, progress);
  if (!quiet)
    std::cerr << "data prepare: " << s.train_instances << " training + " << s.eval_instances << " eval instances, "
              << s.vocab_size << " vocab tokens\n";
  return exit_code::kOk;
}

std::string pct(double x) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(1) << 100.0 * x << "%";
  return s.str();
}

void describe(std::ostream& out, const std::string& label, const ShardData& d, int64_t mask_id) {
  out << label << ": " << d.size() << " samples";
  if (d.size() == 0) {
    out << "\n";
    return;
  }
  out << ", seq_len " << d.seq_len() << ", max_predictions " << d.max_predictions() << "\n";
  out << "  datasets: input_ids/input_mask/segment_ids [" << d.size() << "," << d.seq_len()
      << "], masked_lm_positions/masked_lm_ids [" << d.size() << "," << d.max_predictions()
      << "], next_sentence_labels [" << d.size() << "]\n";
  const double tokens = d.lengths.sum().item<double>();
  const auto masked = d.masked_lm_positions.ne(0);
  const double n_masked = masked.sum().item<double>();
  out << "  tokens: " << static_cast<int64_t>(tokens) << " real (mean length " << std::fixed << std::setprecision(1)
      << tokens / d.size() << ", padding " << pct(1.0 - tokens / (double(d.size()) * d.seq_len())) << ")\n";
  out << "  masked: " << static_cast<int64_t>(n_masked) << " positions (" << pct(n_masked / std::max(tokens, 1.0))
      << " of tokens)";
  if (mask_id >= 0 && n_masked > 0) {
    const auto at = d.input_ids.gather(1, d.masked_lm_positions.to(torch::kLong));
    const double as_mask = (at.eq(mask_id) & masked).sum().item<double>();
    const double kept = (at.eq(d.masked_lm_ids) & masked).sum().item<double>();
    out << ": [MASK] " << pct(as_mask / n_masked) << ", kept " << pct(kept / n_masked) << ", random "
        << pct(1.0 - (as_mask + kept) / n_masked);
  }
  out << "\n  next sentence: " << pct(d.next_sentence_labels.ne(0).sum().item<double>() / d.size()) << " random\n";
  const int64_t bin = std::max<int64_t>(1, d.seq_len() / 8);
  const auto hist = length_histogram(d, bin);
  out << "  length histogram:\n";
  for (std::size_t b = 0; b < hist.size(); ++b)
    out << "    " << std::setw(4) << b * bin + 1 << "-" << std::setw(4) << std::min<int64_t>((b + 1) * bin, d.seq_len())
        << ": " << std::setw(8) << hist[b] << "\n";
}

int64_t mask_id_of(const fs::path& vocab) {
  std::error_code ec;
  if (!fs::exists(vocab, ec)) return -1;
  try {
    return Vocab::load(vocab.string()).mask_id();
  } catch (const DataError&) {
    return -1;
  }
}

int inspect(const Args& a) {
  if (a.has("help")) {
    std::cout << kInspectUsage;
    return exit_code::kOk;
  }
  a.allow_only({"help", "check"});
  if (a.positional().size() != 1) throw UsageError("data inspect takes one DIR or FILE.hdf5");
  const fs::path target = a.positional().front();
  std::error_code ec;
  if (!fs::exists(target, ec)) throw DataError(target.string() + " does not exist");
  if (fs::is_directory(target, ec)) {
    DataConfig cfg;
    cfg.dir = target.string();
    cfg.seq_len = 0;  // take whatever the shards have
    Dataset ds = load_dataset(cfg);
    if (a.has("check")) {
      for (const auto& f : ds.train_files) std::cout << "ok " << f << "\n";
      std::cout << "ok " << (cfg.eval_file.empty() ? (target / "eval.hdf5").string() : cfg.eval_file) << "\n"
                << "dataset " << ds.dir << " is valid: " << ds.train.size() << " training + " << ds.eval.size()
                << " eval samples, vocab " << ds.vocab_size << "\n";
      return exit_code::kOk;
    }
    const int64_t mask = mask_id_of(target / "vocab.txt");
    std::cout << "dataset " << ds.dir << ": " << ds.train_files.size() << " training shard(s), vocab size "
              << ds.vocab_size << "\n";
    for (const auto& f : ds.train_files) std::cout << "  " << f << "\n";
    describe(std::cout, "train", ds.train, mask);
    describe(std::cout, "eval", ds.eval, mask);
    const fs::path meta = target / "meta.yaml";
    if (fs::exists(meta, ec)) std::cout << "meta: " << meta.string() << "\n";
  } else {
    ShardData d = read_shard(target.string());
    const fs::path vocab = target.parent_path() / "vocab.txt";
    int64_t vocab_size = 0;
    if (fs::is_regular_file(vocab, ec)) {
      std::ifstream in(vocab);
      for (std::string line; std::getline(in, line);) ++vocab_size;
    }
    check_shard_values(d, target.string(), vocab_size);
    if (a.has("check")) {
      std::cout << "ok " << target.string() << ": " << d.size() << " samples, values in range\n";
      return exit_code::kOk;
    }
    describe(std::cout, target.string(), d, mask_id_of(vocab));
  }
  return exit_code::kOk;
}

}  // namespace

int data_command(const Argv& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::cout << kDataUsage;
    return args.empty() ? exit_code::kUsage : exit_code::kOk;
  }
  const std::string sub = args[0];
  const Args a(Argv(args.begin() + 1, args.end()), {"quiet", "force", "help", "check"});
  try {
    if (sub == "prepare") return prepare(a);
    if (sub == "inspect") return inspect(a);
  } catch (const DataError& e) {
    std::cerr << describe(e, "bertsweep data " + sub) << "\n";
    return e.exit_code();
  } catch (const std::invalid_argument& e) {
    std::cerr << "bertsweep data " << sub << ": " << e.what() << "\n";
    return exit_code::kUsage;
  }
  std::cerr << "bertsweep data: unknown subcommand '" << sub << "'\n\n" << kDataUsage;
  return exit_code::kUsage;
}

}  // namespace bs::cli
