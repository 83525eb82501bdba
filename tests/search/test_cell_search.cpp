// Stratified studies on a real SQLite study file with real Optuna: each cell's own TPE sampler (its
// suggestions depend on that cell's trials only, and follow them) and the cell-wise median pruner.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <fstream>
#include <utility>

#include "TestUtil.h"
#include "search/OptunaBridge.h"
#include "search/StudyConfig.h"

using namespace bs;
using namespace bs::search;

namespace {

using Params = std::map<std::string, ParamValue>;

StudyConfig config(const std::string& head) {
  return StudyConfig::from_yaml(YAML::Load("name: cells\nseed: 11\nstratify: [optimizer.name]\n" + head +
                                           "space:\n"
                                           "  optimizer.name: {choice: [adam, adamw, lamb]}\n"
                                           "  optimizer.lr: {log_uniform: [0.0001, 0.1]}\n"
                                           "  optimizer.beta2: {uniform: [0.9, 0.999]}\n"),
                                "test");
}

Params cell(const std::string& optimizer) { return {{"optimizer.name", optimizer}}; }

double lr_of(const Params& p) { return std::get<double>(p.at("optimizer.lr")); }

// How far (in decades) a trial's lr is from its cell's best lr: adam is best at 3e-4, lamb 100x higher.
double decades_off(const Params& p) {
  const double best = std::get<std::string>(p.at("optimizer.name")) == "lamb" ? 3e-2 : 3e-4;
  return std::fabs(std::log10(lr_of(p)) - std::log10(best));
}

std::string fresh_db() { return test::make_temp_dir("cells") + "/study.db"; }

}  // namespace

// The point of per-cell sampling: trials of another cell cannot move a cell's suggestions. With one
// sampler for the whole study (enqueue the cell, ask the study) they do.
TEST(CellSearch, SuggestionsForACellDoNotDependOnOtherCells) {
  StudyConfig c = config("sampler: tpe\npruner: none\n");
  auto cell_a_suggestions = [&](bool other_cell_too) {
    OptunaBridge b(fresh_db(), c);
    std::vector<Params> out;
    for (int i = 0; i < 6; ++i) {  // past TPE's 3 startup trials: the model is in use
      if (other_cell_too) {
        auto other = b.ask_in_cell(c.space, c.base(), cell("lamb"));
        if (i == 2) b.tell_fail(other.number);
        else if (i < 5)
          b.tell_complete(other.number, {decades_off(other.params)});  // the last one stays running
      }
      auto a = b.ask_in_cell(c.space, c.base(), cell("adam"));
      EXPECT_EQ(std::get<std::string>(a.params.at("optimizer.name")), "adam");
      out.push_back(a.params);
      b.tell_complete(a.number, {decades_off(a.params)});
    }
    return out;
  };
  const auto alone = cell_a_suggestions(false);
  EXPECT_EQ(alone, cell_a_suggestions(true));
  EXPECT_NE(alone.front(), alone.back());
}

// The cell's sampler learns from the cell's trials: adam's history says lr near 3e-4, lamb's near 3e-2,
// and each cell's next 12 suggestions gather near its own best. A random draw over the 3 decades lands
// within half a decade one time in three (about 4 of 12; with no history given, 6 here); the cell's
// TPE did 9 to 12 under 16 study seeds, one TPE over both cells' trials 2 or 3.
TEST(CellSearch, EachCellFollowsItsOwnHistory) {
  StudyConfig c = config("sampler: tpe\npruner: none\n");
  OptunaBridge b(fresh_db(), c);
  for (const std::string opt : {"adam", "lamb"})
    for (int i = 0; i < 10; ++i) {  // lr evenly spread in log space over the whole range
      Params p = cell(opt);
      p["optimizer.lr"] = std::pow(10.0, -4.0 + 3.0 * (i + 0.5) / 10);
      p["optimizer.beta2"] = 0.9 + 0.0099 * i;
      b.enqueue(p, {});
      auto t = b.ask(c.space, c.base());
      b.tell_complete(t.number, {decades_off(t.params)});
    }
  for (const std::string opt : {"adam", "lamb"}) {
    int near = 0;
    for (int i = 0; i < 12; ++i) {
      auto t = b.ask_in_cell(c.space, c.base(), cell(opt));
      near += decades_off(t.params) < 0.5;
      b.tell_complete(t.number, {decades_off(t.params)});
    }
    EXPECT_GE(near, 8) << opt;
  }
}

// Every parameter lands in the study file with its distribution, so stock Optuna reads the trials; and
// CMA-ES's state goes from each cell trial to the next through the file: a 2-dimensional CMA-ES
// generation has 6 trials, so the 8th trial (after 1 startup trial and 6 told) is of generation 1.
TEST(CellSearch, TheStudyFileRecordsEveryParameterAndTheCellSamplersState) {
  StudyConfig c = config("sampler: cmaes\npruner: none\n");
  const std::string dir = test::make_temp_dir("cells");
  {
    OptunaBridge b(dir + "/study.db", c);
    for (int i = 0; i < 8; ++i) {
      auto t = b.ask_in_cell(c.space, c.base(), cell("adamw"));
      EXPECT_EQ(t.params.size(), 3u);
      b.tell_complete(t.number, {decades_off(t.params)});
    }
  }
  const std::string script = dir + "/read.py";
  std::ofstream(script) << "import optuna, sys\n"
                           "s = optuna.load_study(study_name='cells', storage='sqlite:///' + sys.argv[1])\n"
                           "for t in s.trials:\n"
                           "    print(t.number, t.state.name, t.params['optimizer.name'], len(t.distributions),\n"
                           "          t.system_attrs.get('bs_cell:cma:generation'))\n";
  auto r = test::run({"/usr/bin/python3", script, dir + "/study.db"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("0 COMPLETE adamw 3 None\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("6 COMPLETE adamw 3 0\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("7 COMPLETE adamw 3 1\n"), std::string::npos) << r.out;
}

// random and qmc have no model to mislead: the cell is enqueued into the study and its sampler draws
// the rest, exactly as before per-cell sampling (qmc keeps its sequence).
TEST(CellSearch, RandomAndQmcEnqueueTheCellIntoTheStudy) {
  for (const std::string sampler : {"random", "qmc"}) {
    StudyConfig c = config("sampler: " + sampler + "\npruner: none\n");
    OptunaBridge per_cell(fresh_db(), c), enqueued(fresh_db(), c);
    for (const std::string opt : {"adam", "lamb", "adamw", "adam"}) {
      auto a = per_cell.ask_in_cell(c.space, c.base(), cell(opt));
      enqueued.enqueue(cell(opt), {});
      auto b = enqueued.ask(c.space, c.base());
      EXPECT_EQ(a.params, b.params) << sampler;
      EXPECT_EQ(std::get<std::string>(a.params.at("optimizer.name")), opt);
      per_cell.tell_complete(a.number, {decades_off(a.params)});
      enqueued.tell_complete(b.number, {decades_off(b.params)});
    }
  }
}

namespace {

// One trial of `opt`'s cell that reports (step, value) pairs; completed when `complete`, else left running
// and asked whether to prune it.
bool run_trial(OptunaBridge& b, const StudyConfig& c, const std::string& opt,
               const std::vector<std::pair<int64_t, double>>& reports, bool complete) {
  auto t = b.ask_in_cell(c.space, c.base(), cell(opt));
  for (const auto& [step, value] : reports) b.report(t.number, value, step);
  if (!complete) return b.should_prune(t.number);
  b.tell_complete(t.number, {reports.back().second});
  return false;
}

}  // namespace

// The same trial is pruned in a cell whose trials did better and kept in a cell whose trials did worse
// (the whole study's median, 0.7 at step 100, would prune both); a cell with one finished trial prunes none.
TEST(CellSearch, MedianPrunerComparesATrialWithItsOwnCell) {
  StudyConfig c = config("sampler: random\npruner: median\n");
  OptunaBridge b(fresh_db(), c);
  for (int i = 0; i < 2; ++i) {
    run_trial(b, c, "adam", {{100, 0.5}, {200, 0.4}}, true);
    run_trial(b, c, "lamb", {{100, 0.9}, {200, 0.85}}, true);
  }
  run_trial(b, c, "adamw", {{100, 0.2}}, true);
  EXPECT_TRUE(run_trial(b, c, "adam", {{100, 0.8}}, false));
  EXPECT_FALSE(run_trial(b, c, "lamb", {{100, 0.8}}, false));
  EXPECT_FALSE(run_trial(b, c, "adamw", {{100, 0.99}}, false));
  // The best value so far counts, not the latest: 0.2 at step 100 beats adam's median.
  EXPECT_FALSE(run_trial(b, c, "adam", {{100, 0.2}, {200, 0.9}}, false));
}

// A completed trial that stopped early (it reached the target) counts with its last value at later steps:
// at step 400 adam's trials stand at 0.3 (carried from step 200) and 0.40, median 0.35, so 0.37 is pruned;
// without the carried value the median would be 0.40.
TEST(CellSearch, MedianPrunerCarriesAnEarlyFinishersLastValueForward) {
  StudyConfig c = config("sampler: random\npruner: median\n");
  OptunaBridge b(fresh_db(), c);
  run_trial(b, c, "adam", {{100, 0.5}, {200, 0.3}}, true);
  run_trial(b, c, "adam", {{100, 0.5}, {200, 0.45}, {300, 0.42}, {400, 0.40}}, true);
  EXPECT_TRUE(run_trial(b, c, "adam", {{100, 0.5}, {200, 0.45}, {300, 0.40}, {400, 0.37}}, false));
  EXPECT_FALSE(run_trial(b, c, "adam", {{100, 0.5}, {200, 0.45}, {300, 0.36}, {400, 0.34}}, false));
}

// Maximizing (the controller then reports accuracy): lower than the cell's median is worse.
TEST(CellSearch, MedianPrunerFollowsTheDirection) {
  StudyConfig c = config("sampler: random\npruner: median\nobjective: final_mlm_accuracy\ndirection: maximize\n");
  OptunaBridge b(fresh_db(), c);
  run_trial(b, c, "lamb", {{100, 0.5}}, true);
  run_trial(b, c, "lamb", {{100, 0.6}}, true);
  EXPECT_TRUE(run_trial(b, c, "lamb", {{100, 0.4}}, false));
  EXPECT_FALSE(run_trial(b, c, "lamb", {{100, 0.7}}, false));
}
