// End to end with the real CLI: a small real study (`bertsweep study run`, bert-tiny on the small Brown
// dataset), then `study export` (round trip through `bertsweep train`), `report`, `study confirm`, and
// the error cases. Expected values come from the test's own SQL over the study file.
#include <SQLiteCpp/SQLiteCpp.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <regex>
#include <sys/file.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "PngCheck.h"
#include "StudyFixture.h"
#include "TestUtil.h"
#include "analysis/BatchScaling.h"
#include "analysis/Report.h"
#include "common/TrainConfig.h"
#include "studies/ConfigExport.h"

using namespace bs;
namespace fs = std::filesystem;

namespace {

const char* kStudyName = "exp";

// The study is made once per build dir (tests run as separate processes, maybe in parallel: a lock).
std::string shared_study_dir() {
  const fs::path root = fs::path(test::bertsweep_bin()).parent_path().parent_path() / "testwork" / "report-e2e";
  fs::create_directories(root);
  const std::string lock = (root / "lock").string();
  int fd = open(lock.c_str(), O_CREAT | O_RDWR, 0644);
  flock(fd, LOCK_EX);
  const fs::path dir = root / "studies";
  if (!fs::exists(root / "done")) {
    fs::remove_all(dir);
    const std::string data = test::small_brown_dataset();
    const int parallel = 2;
    const int threads = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / parallel);
    // threads in the base = what the controller passes (cores/parallel), so the stored config is what ran.
    // Stratified: one trial in each (optimizer, batch) cell, so the per-cell report sections always have rows.
    const std::string cfg = (root / "exp.yaml").string();
    std::ofstream(cfg) << "name: exp\nobjective: samples_to_target\nsampler: random\npruner: none\n"
                          "n_trials: 4\nstratify: [optimizer.name, batch.global]\nparallel: "
                       << parallel
                       << "\nseed: 11\ntrial_timeout: 300\n"
                          "base:\n  extends: "
                       << test::source_dir()
                       << "/configs/train/bert-tiny-brown.yaml\n"
                          "  data: {eval_samples: 256}\n  batch: {global: 32, micro: 16}\n  threads: "
                       << threads
                       << "\n  target: {mlm_accuracy: 0.03, max_samples: 3000, eval_every_samples: 512}\n"
                          "space:\n  optimizer.name: {choice: [adamw, lamb]}\n"
                          "  optimizer.lr: {log_uniform: [2.0e-3, 1.0e-2]}\n  batch.global: {choice: [16, 32]}\n"
                          "launcher: {kind: local}\n";
    auto r = test::run({test::bertsweep_bin(), "study", "run", "--config", cfg, "--set", "base.data.dir=" + data,
                        "--dir", dir.string(), "--quiet"},
                       600);
    if (r.exit_code == 0) std::ofstream(root / "done") << "ok\n";
    else
      ADD_FAILURE() << "study run failed (" << r.exit_code << "): " << r.err;
  }
  flock(fd, LOCK_UN);
  close(fd);
  return dir.string();
}

std::string db_of(const std::string& dir) { return dir + "/" + kStudyName + "/study.db"; }

struct Row {
  int64_t number;
  std::string state, config;
  bool reached;
  std::optional<double> samples;
};

std::vector<Row> rows_by_sql(const std::string& db) {
  SQLite::Database sql(db, SQLite::OPEN_READONLY);
  SQLite::Statement q(sql,
                      "SELECT number, state, config_yaml, reached, samples_to_target FROM bs_trials ORDER BY number");
  std::vector<Row> out;
  while (q.executeStep()) {
    Row r{q.getColumn(0).getInt64(), q.getColumn(1).getString(), q.getColumn(2).getString(),
          q.getColumn(3).getInt() != 0, std::nullopt};
    if (!q.getColumn(4).isNull()) r.samples = q.getColumn(4).getDouble();
    out.push_back(r);
  }
  return out;
}

// Best by the rule of the issue, computed here: COMPLETE, reached first, fewest samples, lowest number.
std::optional<Row> best_by_sql(const std::string& db, const std::string& optimizer = "") {
  SQLite::Database sql(db, SQLite::OPEN_READONLY);
  std::optional<Row> best;
  for (const auto& r : rows_by_sql(db)) {
    if (r.state != "COMPLETE") continue;
    if (!optimizer.empty() && YAML::Load(r.config)["optimizer"]["name"].Scalar() != optimizer) continue;
    auto key = [](const Row& x) { return std::make_tuple(!x.reached, x.samples ? *x.samples : INFINITY, x.number); };
    if (!best || key(r) < key(*best)) best = r;
  }
  return best;
}

std::string opt_of(const Row& r) { return YAML::Load(r.config)["optimizer"]["name"].Scalar(); }

std::optional<double> done_samples(const std::string& out) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    // The trainer writes `"key": value` (one space); accept any spacing.
    static const std::regex done("\"event\":\\s*\"done\""), stt("\"samples_to_target\":\\s*([0-9.eE+-]+)");
    if (!std::regex_search(line, done)) continue;
    std::smatch m;
    if (!std::regex_search(line, m, stt)) return std::nullopt;
    return std::strtod(m[1].str().c_str(), nullptr);
  }
  return std::nullopt;
}

}  // namespace

TEST(ExportE2E, BestYamlIsTheStoredConfigAndTrainsToTheSameSamples) {
  const std::string dir = shared_study_dir();
  auto best = best_by_sql(db_of(dir));
  ASSERT_TRUE(best) << "no COMPLETE trial in the study";
  ASSERT_TRUE(best->reached && best->samples) << "the best trial did not reach the target";
  const std::string out = test::make_temp_dir("export-rt");
  auto r = test::run({test::bertsweep_bin(), "study", "export", kStudyName, "--best", "--format", "yaml", "--out",
                      out + "/best.yaml", "--dir", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The stored config with its numbers in the shortest exact form: every value bit-identical.
  EXPECT_EQ(test::file_bytes(out + "/best.yaml"), shorten_yaml_numbers(best->config));
  EXPECT_EQ(TrainConfig::load(out + "/best.yaml").to_yaml_string(),
            TrainConfig::from_yaml(YAML::Load(best->config), "stored").to_yaml_string());
  EXPECT_NE(r.err.find("trial " + std::to_string(best->number)), std::string::npos) << r.err;

  auto t =
      test::run({test::bertsweep_bin(), "train", "--config", out + "/best.yaml", "--events", "stdout", "--quiet"}, 300);
  ASSERT_EQ(t.exit_code, 0) << t.err;
  auto samples = done_samples(t.out);
  ASSERT_TRUE(samples) << t.out;
  EXPECT_EQ(*samples, *best->samples);
  // The report's parameter count (the modelled allreduce size) from the stored config and the data's vocab.txt
  // equals what the trainer counted in its start event.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(t.out, m, std::regex("\"event\":\\s*\"start\"[^\\n]*\"parameters\":\\s*([0-9]+)")))
      << t.out;
  TrainConfig stored = TrainConfig::read_stored(best->config);
  std::string where;
  auto vocab = analysis::vocab_size_of(stored, where);
  ASSERT_TRUE(vocab) << where;
  stored.model.vocab_size = *vocab;
  EXPECT_EQ(analysis::bert_parameter_count(stored.model), std::stoll(m[1].str())) << where;
}

TEST(ExportE2E, WhereTopSetAndMlperfJson) {
  const std::string dir = shared_study_dir();
  auto best = best_by_sql(db_of(dir));
  ASSERT_TRUE(best);
  const std::string opt = opt_of(*best);
  auto best_opt = best_by_sql(db_of(dir), opt);
  const std::string out = test::make_temp_dir("export-where");
  auto r = test::run({test::bertsweep_bin(), "study", "export", kStudyName, "--best", "--where", "optimizer=" + opt,
                      "--top", "3", "--out", out + "/cfg.yaml", "--dir", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(test::file_bytes(out + "/cfg-1.yaml"), shorten_yaml_numbers(best_opt->config));
  for (int i = 1; i <= 3 && fs::exists(out + "/cfg-" + std::to_string(i) + ".yaml"); ++i)
    EXPECT_EQ(YAML::LoadFile(out + "/cfg-" + std::to_string(i) + ".yaml")["optimizer"]["name"].Scalar(), opt);

  r = test::run({test::bertsweep_bin(), "study", "export", kStudyName, "--best", "--out", out + "/prod.yaml", "--set",
                 "data.dir=/prod/bert", "--set", "batch.micro=4", "--dir", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  YAML::Node prod = YAML::LoadFile(out + "/prod.yaml"), stored = YAML::Load(best->config);
  EXPECT_EQ(prod["data"]["dir"].Scalar(), "/prod/bert");
  EXPECT_EQ(prod["batch"]["micro"].as<int>(), 4);
  EXPECT_EQ(prod["optimizer"]["lr"].as<double>(), stored["optimizer"]["lr"].as<double>());
  EXPECT_EQ(prod["batch"]["global"].as<int64_t>(), stored["batch"]["global"].as<int64_t>());

  r = test::run({test::bertsweep_bin(), "study", "export", kStudyName, "--best", "--format", "mlperf-json", "--out",
                 out + "/h.json", "--dir", dir});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ofstream(out + "/check.py") << "import json,sys\nd=json.load(open(sys.argv[1]))\n"
                                      "print(d['global_batch_size'], repr(d['opt_base_learning_rate']), "
                                      "d['bertsweep']['trial'])\n";
  auto py = test::run({"/usr/bin/python3", out + "/check.py", out + "/h.json"});
  ASSERT_EQ(py.exit_code, 0) << py.err;
  std::ostringstream want;
  want.precision(17);
  want << stored["batch"]["global"].as<int64_t>() << " " << stored["optimizer"]["lr"].as<double>() << " "
       << best->number;
  // Python's repr is the shortest round-trip form; compare the numbers, not their spelling.
  std::istringstream got(py.out);
  int64_t gb, trial;
  double lr;
  got >> gb >> lr >> trial;
  EXPECT_EQ(gb, stored["batch"]["global"].as<int64_t>()) << want.str();
  EXPECT_EQ(lr, stored["optimizer"]["lr"].as<double>());
  EXPECT_EQ(trial, best->number);
}

TEST(ExportE2E, BadInputsExitWithStudyErrorAndSayWhy) {
  const std::string dir = shared_study_dir();
  auto r = test::run({test::bertsweep_bin(), "study", "export", "no-such-study", "--best", "--dir", dir});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_NE(r.err.find("unknown study 'no-such-study'"), std::string::npos) << r.err;

  r = test::run(
      {test::bertsweep_bin(), "study", "export", kStudyName, "--best", "--where", "optimizer=sgd", "--dir", dir});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_NE(r.err.find("matches --where optimizer.name=sgd"), std::string::npos) << r.err;

  r = test::run({test::bertsweep_bin(), "study", "export", kStudyName, "--where", "optimiser=lamb", "--dir", dir});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("optimiser"), std::string::npos) << r.err;

  // A study whose only trials failed or were pruned (written through the real store).
  const std::string empty = test::make_temp_dir("export-empty");
  fs::create_directories(empty + "/nothing");
  {
    StudyStore s(empty + "/nothing/study.db");
    s.insert_trial(test::make_trial(0, trial_state::kFail, "lamb", 32, false, std::nullopt));
    s.insert_trial(test::make_trial(1, trial_state::kPruned, "lamb", 32, false, std::nullopt));
  }
  for (const std::string sub : {"export", "confirm"}) {
    r = test::run({test::bertsweep_bin(), "study", sub, "nothing", "--dir", empty});
    EXPECT_EQ(r.exit_code, 7) << sub << ": " << r.err;
    EXPECT_NE(r.err.find("no COMPLETE trial"), std::string::npos) << sub << ": " << r.err;
  }
  r = test::run({test::bertsweep_bin(), "report", "no-such-study", "--out", empty + "/rep", "--dir", dir});
  EXPECT_EQ(r.exit_code, 7) << r.err;
  EXPECT_NE(r.err.find("unknown study"), std::string::npos) << r.err;
}

TEST(ReportE2E, RealStudyReportRendersWithTheStudyNumbers) {
  const std::string dir = shared_study_dir();
  const std::string out = test::make_temp_dir("report-e2e-out");
  auto r = test::run({test::bertsweep_bin(), "report", kStudyName, "--out", out, "--dir", dir}, 300);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = test::file_bytes(out + "/report.md"), html = test::file_bytes(out + "/report.html");

  std::map<std::pair<std::string, int64_t>, std::vector<double>> samples;
  std::map<std::pair<std::string, int64_t>, int> count;
  int complete = 0, pruned = 0, failed = 0;
  for (const auto& row : rows_by_sql(db_of(dir))) {
    YAML::Node c = YAML::Load(row.config);
    auto key = std::make_pair(c["optimizer"]["name"].Scalar(), c["batch"]["global"].as<int64_t>());
    ++count[key];
    complete += row.state == "COMPLETE";
    pruned += row.state == "PRUNED";
    failed += row.state == "FAIL";
    if (row.state == "COMPLETE" && row.reached && row.samples) samples[key].push_back(*row.samples);
  }
  const std::string counts =
      "| " + std::to_string(rows_by_sql(db_of(dir)).size()) + " | " + std::to_string(complete) + " |";
  EXPECT_NE(md.find(counts), std::string::npos) << counts << "\n" << md;
  EXPECT_NE(md.find(" | " + std::to_string(pruned) + " | " + std::to_string(failed) + " | 0 |"), std::string::npos);
  for (const auto& [key, n] : count) {
    std::string head = "| " + key.first + " | " + std::to_string(key.second) + " | " + std::to_string(n) + " |";
    EXPECT_NE(md.find(head), std::string::npos) << head << "\n" << md;
    const auto& xs = samples[key];
    if (xs.empty()) continue;
    double best = *std::min_element(xs.begin(), xs.end()), mean = 0, ss = 0;
    for (double x : xs) mean += x;
    mean /= xs.size();
    for (double x : xs) ss += (x - mean) * (x - mean);
    const double sd = xs.size() > 1 ? std::sqrt(ss / (xs.size() - 1)) : 0.0;
    const std::string tail = " | " + analysis::format_number(best) + " | " + analysis::format_number(mean) + " | " +
                             analysis::format_number(sd) + " |";
    EXPECT_NE(md.find(tail), std::string::npos) << key.first << "/" << key.second << tail << "\n" << md;
  }
  // Importance: a table from Optuna or the reason there is none.
  EXPECT_TRUE(md.find("ImportanceEvaluator over the COMPLETE trials") != std::string::npos ||
              md.find("Not available:") != std::string::npos)
      << md;
  // The environment of the study's session.
  SQLite::Database sql(db_of(dir), SQLite::OPEN_READONLY);
  SQLite::Statement env(sql,
                        "SELECT key, value FROM bs_environment WHERE session = (SELECT MAX(session) FROM "
                        "bs_environment) LIMIT 3");
  while (env.executeStep())
    EXPECT_NE(md.find("| " + env.getColumn(0).getString() + " |"), std::string::npos) << env.getColumn(0).getString();

  int pngs = 0;
  for (const auto& e : fs::directory_iterator(out)) {
    if (e.path().extension() != ".png") continue;
    ++pngs;
    const std::string name = e.path().filename().string();
    auto info = test::inspect_png(e.path().string());
    EXPECT_TRUE(info.signature_ok) << name;
    EXPECT_GE(info.width, 300u) << name;
    EXPECT_GT(info.bytes, 5000u) << name;
    EXPECT_GT(info.distinct_colours, 8) << name;
    EXPECT_NE(md.find("](" + name + ")"), std::string::npos) << name;
    const std::string marker = "data-file=\"" + name + "\" src=\"data:image/png;base64,";
    const auto at = html.find(marker);
    ASSERT_NE(at, std::string::npos) << name;
    const auto start = at + marker.size();
    EXPECT_EQ(html.substr(start, html.find('"', start) - start), analysis::base64(test::file_bytes(e.path())));
  }
  EXPECT_GE(pngs, 3);  // convergence, pareto, history (+ importance when Optuna has one)
  std::cout << "report written to " << out << "\n";
}

// --per-batch: one confirmation per (optimizer, batch) pair, from that pair's best trial (found by SQL here),
// stored with its batch; the report then plots samples to target vs batch size when a pair reached.
TEST(ConfirmE2E, PerBatchConfirmsTheBestTrialOfEveryOptimizerAndBatch) {
  const std::string shared = shared_study_dir();
  const std::string dir = test::make_temp_dir("confirm-e2e");
  fs::copy(shared + "/" + kStudyName, dir + "/" + kStudyName, fs::copy_options::recursive);
  auto r = test::run({test::bertsweep_bin(), "study", "confirm", kStudyName, "--seeds", "1", "--per-batch",
                      "--parallel", "2", "--dir", dir},
                     600);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // Best per pair by SQL: reached first, then fewest samples, then lowest trial number.
  std::map<std::pair<std::string, int64_t>, Row> best;
  for (const auto& row : rows_by_sql(db_of(dir))) {
    if (row.state != "COMPLETE") continue;
    const auto key = std::make_pair(opt_of(row), YAML::Load(row.config)["batch"]["global"].as<int64_t>());
    auto rank = [](const Row& x) { return std::make_tuple(!x.reached, x.samples ? *x.samples : INFINITY, x.number); };
    auto it = best.find(key);
    if (it == best.end() || rank(row) < rank(it->second)) best[key] = row;
  }
  ASSERT_FALSE(best.empty());
  SQLite::Database sql(db_of(dir), SQLite::OPEN_READONLY);
  SQLite::Statement q(sql, "SELECT optimizer, batch, source_trial, seed, exit_code FROM bs_confirm ORDER BY 1, 2");
  std::map<std::pair<std::string, int64_t>, int64_t> confirmed;
  while (q.executeStep()) {
    confirmed[{q.getColumn(0).getString(), q.getColumn(1).getInt64()}] = q.getColumn(2).getInt64();
    EXPECT_EQ(q.getColumn(3).getInt64(), 1);
    EXPECT_EQ(q.getColumn(4).getInt(), 0);
  }
  // A pair whose best trial never reached the target has nothing to confirm: skipped, and said so.
  size_t reached = 0;
  for (const auto& [key, row] : best) {
    if (!row.reached) {
      EXPECT_FALSE(confirmed.count(key)) << key.first << " batch " << key.second;
      EXPECT_NE(r.out.find("skipping " + key.first + " batch " + std::to_string(key.second) + ": its best trial " +
                           std::to_string(row.number) + " did not reach the target"),
                std::string::npos)
          << r.out;
      continue;
    }
    ++reached;
    ASSERT_TRUE(confirmed.count(key)) << key.first << " batch " << key.second;
    EXPECT_EQ(confirmed[key], row.number) << key.first << " batch " << key.second;
  }
  ASSERT_EQ(confirmed.size(), reached) << r.out;
  const std::string out = dir + "/report";
  auto rep = test::run({test::bertsweep_bin(), "report", kStudyName, "--out", out, "--dir", dir}, 300);
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  const std::string md = test::file_bytes(out + "/report.md");
  EXPECT_NE(md.find("| optimizer | batch | source trial |"), std::string::npos) << md;
  std::set<std::string> optimizers;
  for (const auto& kv : best) optimizers.insert(kv.first.first);
  ASSERT_GT(best.size(), optimizers.size()) << "the stratified study has two batch sizes per optimizer";
  {
    // The same "| opt | batch | trial |" opening appears in the confirmation table: look in the section.
    const auto section = md.find("### Best trial per optimizer and batch size");
    ASSERT_NE(section, std::string::npos) << md;
    for (const auto& [key, row] : best) {
      const std::string line =
          "| " + key.first + " | " + std::to_string(key.second) + " | " + std::to_string(row.number) + " | ";
      const auto at = md.find(line, section);
      ASSERT_NE(at, std::string::npos) << line << "\n" << md;
      // The warmup as the trial configured it (a fraction of the schedule when its steps are -1).
      const YAML::Node schedule = YAML::Load(row.config)["schedule"];
      bs::ScheduleConfig sc;
      sc.warmup_steps = schedule["warmup_steps"].as<int64_t>(-1);
      sc.warmup_fraction = schedule["warmup_fraction"].as<double>(0.0);
      const std::string table_row = md.substr(at, md.find('\n', at) - at);
      EXPECT_NE(table_row.find("| " + bs::analysis::warmup_text(sc) + " |"), std::string::npos) << table_row;
    }
  }
  EXPECT_TRUE(fs::exists(out + "/" + std::string(kStudyName) + "-confirm.png"));
  // An optimizer whose runs reached at two batch sizes or more: the batch-scaling sections and their plots.
  SQLite::Statement reached_q(sql, "SELECT optimizer, COUNT(DISTINCT batch) FROM bs_confirm WHERE reached GROUP BY 1");
  bool several = false;
  while (reached_q.executeStep()) several = several || reached_q.getColumn(1).getInt() > 1;
  for (const std::string h : {"#### Samples and steps to target vs batch size", "#### Critical batch size",
                              "#### Time to train: measured on this machine", "#### Adam family vs LAMB family"})
    EXPECT_EQ(md.find(h) != std::string::npos, several) << h << "\n" << md;
  EXPECT_EQ(fs::exists(out + "/" + std::string(kStudyName) + "-batch-scaling.png"), several);
  if (several) {  // the real study's data folder has vocab.txt: the time model runs
    EXPECT_TRUE(fs::exists(out + "/" + std::string(kStudyName) + "-time-to-train.png")) << md;
    EXPECT_NE(md.find("parameters x 4 bytes (fp32)"), std::string::npos) << md;
  }
}

TEST(ConfirmE2E, SeedsPerOptimizerAreStoredAndSummarised) {
  const std::string shared = shared_study_dir();
  // A copy: confirm writes bs_confirm into the study file.
  const std::string dir = test::make_temp_dir("confirm-e2e");
  fs::copy(shared + "/" + kStudyName, dir + "/" + kStudyName, fs::copy_options::recursive);
  const std::string mllog = dir + "/mlperf";  // --mllog-dir: result_N.txt per (optimizer, batch)
  auto r = test::run({test::bertsweep_bin(), "study", "confirm", kStudyName, "--seeds", "2", "--parallel", "2", "--dir",
                      dir, "--mllog-dir", mllog},
                     600);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::set<std::string> optimizers;
  for (const auto& row : rows_by_sql(db_of(dir)))
    if (row.state == "COMPLETE") optimizers.insert(opt_of(row));
  SQLite::Database sql(db_of(dir), SQLite::OPEN_READONLY);
  for (const auto& opt : optimizers) {
    auto best = best_by_sql(db_of(dir), opt);
    SQLite::Statement q(sql,
                        "SELECT seed, source_trial, exit_code, reached, samples_to_target FROM bs_confirm "
                        "WHERE optimizer = ? ORDER BY seed");
    q.bind(1, opt);
    std::vector<double> xs;
    std::vector<int64_t> seeds;
    while (q.executeStep()) {
      seeds.push_back(q.getColumn(0).getInt64());
      EXPECT_EQ(q.getColumn(1).getInt64(), best->number);
      EXPECT_EQ(q.getColumn(2).getInt(), 0);
      if (q.getColumn(3).getInt()) xs.push_back(q.getColumn(4).getDouble());
    }
    if (!best->reached) {  // nothing to confirm: skipped
      EXPECT_TRUE(seeds.empty()) << opt;
      EXPECT_NE(r.out.find("skipping " + opt + ": its best trial"), std::string::npos) << r.out;
      continue;
    }
    EXPECT_EQ(seeds, (std::vector<int64_t>{1, 2})) << opt;
    // Seed k's MLLOG as result_k.txt in the results/<system>/bert/ layout, each a whole run with its seed.
    const int64_t batch = YAML::Load(best->config)["batch"]["global"].as<int64_t>();
    for (int k = 0; k < 2; ++k) {
      const std::string path =
          mllog + "/" + opt + "-b" + std::to_string(batch) + "/bert/result_" + std::to_string(k) + ".txt";
      ASSERT_TRUE(fs::exists(path)) << path;
      const std::string log = test::file_bytes(path);
      EXPECT_EQ(log.rfind(":::MLLOG ", 0), 0u) << path;
      EXPECT_NE(log.find("\"run_stop\""), std::string::npos) << path;
      EXPECT_TRUE(std::regex_search(log, std::regex("\"key\": \"seed\", \"value\": " + std::to_string(k + 1) + "[,}]")))
          << path;
    }
    if (xs.empty()) continue;
    double mean = 0, ss = 0;
    for (double x : xs) mean += x;
    mean /= xs.size();
    for (double x : xs) ss += (x - mean) * (x - mean);
    const double sd = xs.size() > 1 ? std::sqrt(ss / (xs.size() - 1)) : 0.0;
    const std::string want = analysis::format_number(mean) + " +- " + analysis::format_number(sd);
    EXPECT_NE(r.out.find(want), std::string::npos) << opt << ": " << want << "\n" << r.out;
  }
  // Again into the same folder: refused before any run (no result file overwritten, no new confirm row).
  SQLite::Statement count(sql, "SELECT COUNT(*) FROM bs_confirm");
  ASSERT_TRUE(count.executeStep());
  const int64_t rows = count.getColumn(0).getInt64();
  auto again = test::run(
      {test::bertsweep_bin(), "study", "confirm", kStudyName, "--seeds", "2", "--dir", dir, "--mllog-dir", mllog}, 120);
  EXPECT_EQ(again.exit_code, 7) << again.err;
  EXPECT_NE(again.err.find("result_0.txt exists already"), std::string::npos) << again.err;
  SQLite::Statement count2(sql, "SELECT COUNT(*) FROM bs_confirm");
  ASSERT_TRUE(count2.executeStep());
  EXPECT_EQ(count2.getColumn(0).getInt64(), rows);

  const std::string out = dir + "/report";
  auto rep = test::run({test::bertsweep_bin(), "report", kStudyName, "--out", out, "--dir", dir}, 300);
  ASSERT_EQ(rep.exit_code, 0) << rep.err;
  EXPECT_NE(test::file_bytes(out + "/report.md").find("Confirmation runs"), std::string::npos);
  EXPECT_TRUE(fs::exists(out + "/" + std::string(kStudyName) + "-confirm.png"));
}
