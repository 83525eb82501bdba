// The report's plots (matplotlib in the embedded interpreter) and the report of a study written through the
// real StudyStore: valid non-trivial PNGs, tables equal to the test's own SQL, the HTML embeds the PNG files.
#include <SQLiteCpp/SQLiteCpp.h>
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>

#include "PngCheck.h"
#include "StudyFixture.h"
#include "TestUtil.h"
#include "analysis/ConfirmSummary.h"
#include "analysis/Report.h"
#include "analysis/ReportPlots.h"

using namespace bs;
using namespace bs::analysis;
namespace fs = std::filesystem;

namespace {
void expect_real_png(const std::string& path) {
  ASSERT_TRUE(fs::exists(path)) << path;
  auto info = test::inspect_png(path);
  EXPECT_TRUE(info.signature_ok) << path;
  EXPECT_GE(info.width, 300u) << path;
  EXPECT_GE(info.height, 200u) << path;
  EXPECT_GT(info.bytes, 5000u) << path;
  EXPECT_GT(info.distinct_colours, 8) << path << ": looks like a blank image";
}
}  // namespace

TEST(ReportPlots, EachPlotIsANonTrivialPng) {
  const std::string dir = test::make_temp_dir("plots");
  Curve a{"lamb", {1000, 2000, 3000, 4000}, {0.05, 0.1, 0.16, 0.21}};
  Curve b{"adamw", {1000, 2000, 3000}, {0.04, 0.12, 0.2}};
  plot_convergence(dir + "/c.png", {a, b}, 0.2, "convergence");
  expect_real_png(dir + "/c.png");
  std::vector<ParetoPoint> pts = {
      {1, 32, 3000, "lamb"}, {2, 64, 3500, "lamb"}, {3, 64, 5000, "adamw"}, {4, 128, 7000, "adamw"}};
  plot_pareto(dir + "/p.png", pts, {pts[0], pts[1], pts[3]}, "pareto");
  expect_real_png(dir + "/p.png");
  std::vector<HistoryPoint> h = {{0, "COMPLETE", 5000.0, 5000.0},
                                 {1, "PRUNED", std::nullopt, 5000.0},
                                 {2, "COMPLETE", 3000.0, 3000.0},
                                 {3, "FAIL", std::nullopt, 3000.0}};
  plot_history(dir + "/h.png", h, "samples_to_target", "history");
  expect_real_png(dir + "/h.png");
  plot_confirm(dir + "/f.png", {{"lamb", {3000, 3200, 2900}}, {"adamw", {5000, 5600}}}, "confirm");
  expect_real_png(dir + "/f.png");
  plot_confirm_vs_batch(dir + "/fb.png",
                        {{"lamb", {64, 256, 1024}, {3000, 3500, 5200}, {100, 300, 800}, {3, 3, 2}},
                         {"adam", {64, 256}, {2800, 4100}, {200, 0}, {3, 1}}},
                        "confirm vs batch");
  expect_real_png(dir + "/fb.png");
}

TEST(ReportPlots, ImportanceWithoutOptunaTablesSaysSoAndWritesNothing) {
  const std::string dir = test::make_temp_dir("noimp");
  { StudyStore s(dir + "/study.db"); }
  auto imp = param_importance(dir + "/study.db", "s", dir + "/imp.png", "t");
  EXPECT_FALSE(imp.available());
  EXPECT_NE(imp.message.find("no Optuna study"), std::string::npos) << imp.message;
  EXPECT_FALSE(fs::exists(dir + "/imp.png"));
  SQLite::Database sql(dir + "/study.db", SQLite::OPEN_READONLY);
  EXPECT_FALSE(sql.tableExists("studies"));  // read-only: Optuna created no tables
}

TEST(Report, StoreStudyRendersTablesEqualToOwnSql) {
  const std::string root = test::make_temp_dir("report");
  fs::create_directories(root + "/studies/syn");
  const std::string db = root + "/studies/syn/study.db";
  {
    StudyStore store(db);
    store.save_study("syn", "name: syn\nobjective: samples_to_target\ndirection: minimize\n");
    store.record_environment({{"host", "testhost"}, {"torch", "1.13"}});
    test::fill_random_study(store, 30, 21);
    for (const auto& t : store.trials())
      for (int k = 1; k <= 5; ++k)
        store.add_eval(
            {t.number, k * 10, k * 1000, 0.04 * k + 0.001 * static_cast<double>(t.number), 5.0 - k, 1.0 * k});
    ConfirmStore confirm(db, true);
    for (int s = 1; s <= 3; ++s) confirm.add({1, "lamb", 0, s, 0, true, 3000.0 + 100 * s, 1.0, 0.3, "seed: 1\n", ""});
  }
  ReportOptions o;
  o.studies = {"syn"};
  o.dir = root + "/studies";
  o.out_dir = root + "/out";
  auto files = write_report(o);
  const std::string md = test::file_bytes(files.markdown);
  const std::string html = test::file_bytes(files.html);
  ASSERT_FALSE(md.empty());
  ASSERT_FALSE(html.empty());

  // Each optimizer x batch row, computed from our own SQL.
  std::map<std::pair<std::string, int64_t>, std::vector<double>> samples;
  std::map<std::pair<std::string, int64_t>, int> count;
  {
    SQLite::Database sql(db, SQLite::OPEN_READONLY);
    SQLite::Statement q(sql, "SELECT state, reached, samples_to_target, config_yaml FROM bs_trials");
    while (q.executeStep()) {
      YAML::Node c = YAML::Load(q.getColumn(3).getString());
      auto key = std::make_pair(c["optimizer"]["name"].Scalar(), c["batch"]["global"].as<int64_t>());
      ++count[key];
      if (q.getColumn(0).getString() == "COMPLETE" && q.getColumn(1).getInt())
        samples[key].push_back(q.getColumn(2).getDouble());
    }
  }
  for (const auto& [key, n] : count) {
    const auto& xs = samples[key];
    std::string expect = "| " + key.first + " | " + std::to_string(key.second) + " | " + std::to_string(n) + " |";
    if (!xs.empty()) {
      double best = *std::min_element(xs.begin(), xs.end()), mean = 0, ss = 0;
      for (double x : xs) mean += x;
      mean /= xs.size();
      for (double x : xs) ss += (x - mean) * (x - mean);
      double sd = xs.size() > 1 ? std::sqrt(ss / (xs.size() - 1)) : 0.0;
      std::string tail = " | " + format_number(best) + " | " + format_number(mean) + " | " + format_number(sd) + " |";
      EXPECT_NE(md.find(tail), std::string::npos) << "row " << key.first << "/" << key.second << " missing" << tail;
    }
    EXPECT_NE(md.find(expect), std::string::npos) << expect << "\n" << md;
  }
  EXPECT_NE(md.find("3200 +- 100"), std::string::npos);  // confirm: mean 3200, sample std 100
  EXPECT_NE(md.find("testhost"), std::string::npos);
  EXPECT_NE(md.find("no Optuna study"), std::string::npos);

  // Every PNG: real, linked from the Markdown, embedded byte-exact in the HTML.
  ASSERT_GE(files.images.size(), 4u);
  for (const auto& png : files.images) {
    expect_real_png(png);
    const std::string name = fs::path(png).filename().string();
    EXPECT_NE(md.find("](" + name + ")"), std::string::npos) << name;
    const std::string marker = "data-file=\"" + name + "\" src=\"data:image/png;base64,";
    const auto at = html.find(marker);
    ASSERT_NE(at, std::string::npos) << name;
    const auto start = at + marker.size();
    EXPECT_EQ(html.substr(start, html.find('"', start) - start), base64(test::file_bytes(png))) << name;
  }
}

TEST(Report, Base64MatchesKnownVectors) {
  // RFC 4648 section 10 test vectors.
  EXPECT_EQ(base64(""), "");
  EXPECT_EQ(base64("f"), "Zg==");
  EXPECT_EQ(base64("fo"), "Zm8=");
  EXPECT_EQ(base64("foo"), "Zm9v");
  EXPECT_EQ(base64("foob"), "Zm9vYg==");
  EXPECT_EQ(base64("fooba"), "Zm9vYmE=");
  EXPECT_EQ(base64("foobar"), "Zm9vYmFy");
}

TEST(Report, UnknownStudyIsAStudyError) {
  ReportOptions o;
  o.studies = {"nope"};
  o.dir = test::make_temp_dir("report-unknown");
  o.out_dir = o.dir + "/out";
  EXPECT_THROW(write_report(o), StudyError);
  EXPECT_FALSE(fs::exists(o.out_dir));
}
