// The one mapping from error to exit code (common/Errors.h), and the places that state it: `bertsweep --help`,
// README's exit-code paragraph and the message format every command prints.
#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "TestUtil.h"
#include "common/Errors.h"

namespace {

std::set<int> table_codes() {
  std::set<int> codes;
  for (const bs::ExitCodeInfo& c : bs::kExitCodes) codes.insert(c.code);
  return codes;
}

// README's paragraph that starts with "Exit codes" (up to the next blank line).
std::string readme_exit_code_paragraph() {
  std::ifstream in(bs::test::source_dir() + "/README.md");
  std::string line, para;
  bool in_para = false;
  while (std::getline(in, line)) {
    if (!in_para && line.rfind("Exit codes", 0) == 0) in_para = true;
    if (in_para && line.empty()) break;
    if (in_para) para += line + " ";
  }
  return para;
}

}  // namespace

TEST(Errors, EachErrorTypeCarriesItsExitCode) {
  EXPECT_EQ(bs::UsageError("x").exit_code(), bs::exit_code::kUsage);
  EXPECT_EQ(bs::ConfigError("x").exit_code(), bs::exit_code::kUsage);
  EXPECT_EQ(bs::DataError("x").exit_code(), bs::exit_code::kData);
  EXPECT_EQ(bs::NonFiniteLoss("x").exit_code(), bs::exit_code::kNonFinite);
  EXPECT_EQ(bs::DistributedError("x").exit_code(), bs::exit_code::kDistributed);
  EXPECT_EQ(bs::Terminated("x").exit_code(), bs::exit_code::kTerminated);
  EXPECT_EQ(bs::StudyError("x").exit_code(), bs::exit_code::kStudy);
  // Every code an error can carry is in the table that --help and README state.
  for (int code : {bs::exit_code::kUsage, bs::exit_code::kData, bs::exit_code::kNonFinite, bs::exit_code::kDistributed,
                   bs::exit_code::kTerminated, bs::exit_code::kStudy})
    EXPECT_TRUE(table_codes().count(code)) << code;
}

TEST(Errors, DescribeNamesTheCommandAndTheKind) {
  EXPECT_EQ(bs::describe(bs::ConfigError("f.yaml:3: key 'x' unknown"), "bertsweep train"),
            "bertsweep train: config error: f.yaml:3: key 'x' unknown");
  EXPECT_EQ(bs::describe(bs::DataError("shard truncated"), "bertsweep data inspect"),
            "bertsweep data inspect: data error: shard truncated");
  EXPECT_EQ(bs::describe(bs::UsageError("option --out is required"), "bertsweep report"),
            "bertsweep report: option --out is required (see bertsweep report --help)");
  EXPECT_EQ(bs::describe(bs::StudyError("no study 'x'"), "bertsweep study status"),
            "bertsweep study status: no study 'x'");
}

TEST(Errors, ReadmeStatesExactlyTheTableOfCodes) {
  const std::string para = readme_exit_code_paragraph();
  ASSERT_FALSE(para.empty()) << "README.md has no paragraph starting with 'Exit codes'";
  for (const bs::ExitCodeInfo& c : bs::kExitCodes)
    EXPECT_NE(para.find(std::to_string(c.code) + " " + c.meaning), std::string::npos)
        << "README's exit codes lack '" << c.code << " " << c.meaning << "': " << para;
  // Every "N meaning" item of the list (after ':' or ',') is a code of the table: no stale code survives.
  std::set<int> stated;
  const std::regex item("[:,] ([0-9]+) [a-zA-Z]");
  for (auto it = std::sregex_iterator(para.begin(), para.end(), item); it != std::sregex_iterator(); ++it)
    stated.insert(std::stoi((*it)[1]));
  EXPECT_EQ(stated, table_codes()) << para;
}

TEST(Errors, HelpPrintsTheTable) {
  const auto r = bs::test::run({bs::test::bertsweep_bin(), "--help"}, 60);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("exit codes: " + bs::exit_codes_summary()), std::string::npos) << r.out;
  EXPECT_EQ(bs::exit_codes_summary().rfind("0 ok, 1 internal error, 2 usage/config error", 0), 0u);
}
