// Bad input to the real CLI: each is refused with an error that names what is wrong and a non-zero exit
// code, and an existing study beside it is left byte for byte as it was.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <tuple>

#include <SQLiteCpp/SQLiteCpp.h>

#include "ReliabilityUtil.h"

using namespace bs;
namespace fs = std::filesystem;

namespace {

// One existing, finished study ("kept", one tiny trial) that every refused command must leave untouched.
class BadInput : public ::testing::Test {
 protected:
  // ctest runs each test in its own process: the study is made once per build (under a lock, like the
  // small dataset) and each process works on its own copy.
  static void SetUpTestSuite() {
    dir_ = test::make_temp_dir("rel-badinput");
    fs::path root = fs::path(dir_).parent_path(), made = root / "rel-kept-study";
    int fd = open((root / "rel-kept-study.lock").c_str(), O_CREAT | O_RDWR, 0644);
    flock(fd, LOCK_EX);
    if (!fs::exists(made / "kept" / "study.db")) {
      fs::remove_all(made);
      fs::create_directories(made);
      auto r = test::run(test::smoke_study(made.string(), "kept",
                                           {"n_trials=1", "parallel=1", "base.target.max_samples=64",
                                            "base.target.eval_every_samples=32", "base.data.eval_samples=32"}),
                         300);
      if (r.exit_code != 0) fs::remove_all(made);
      EXPECT_EQ(r.exit_code, 0) << r.err;
    }
    flock(fd, LOCK_UN);
    close(fd);
    if (fs::exists(made / "kept")) fs::copy(made / "kept", fs::path(dir_) / "kept", fs::copy_options::recursive);
  }
  void SetUp() override {
    ASSERT_TRUE(fs::exists(dir_ + "/kept/study.db")) << "the study to keep unchanged was not made";
    before_ = test::folder_fingerprint(dir_ + "/kept");
  }
  void TearDown() override { EXPECT_EQ(test::folder_fingerprint(dir_ + "/kept"), before_) << "the study was changed"; }

  // A study config in the style of configs/studies/smoke.yaml; `space` and `extra` replace parts of it.
  static std::string write_config(const std::string& file, const std::string& space, const std::string& extra = "") {
    std::string path = dir_ + "/" + file;
    std::ofstream(path) << "name: kept\nobjective: samples_to_target\nsampler: random\nn_trials: 2\n"
                        << "base:\n  extends: " << test::source_dir() << "/configs/train/bert-tiny-brown.yaml\n"
                        << "  data: {dir: " << test::small_brown_dataset() << "}\n"
                        << "space:\n"
                        << space << extra;
    return path;
  }
  static test::RunResult study_run(const std::string& config, const std::vector<std::string>& sets = {}) {
    std::vector<std::string> a = {test::bertsweep_bin(), "study", "run", "--config", config, "--dir", dir_, "--quiet"};
    for (const auto& s : sets) a.insert(a.end(), {"--set", s});
    return test::run(a, 120);
  }
  static std::string good_space() { return "  optimizer.lr: {log_uniform: [1.0e-3, 1.0e-2]}\n"; }

  static std::string dir_;
  std::string before_;
};
std::string BadInput::dir_;

#define EXPECT_REFUSED(r, code, needle)                                         \
  do {                                                                          \
    EXPECT_EQ((r).exit_code, code) << (r).err;                                  \
    EXPECT_NE((r).err.find(needle), std::string::npos) << "error: " << (r).err; \
  } while (0)

}  // namespace

TEST_F(BadInput, MalformedYaml) {
  std::string path = dir_ + "/malformed.yaml";
  std::ofstream(path) << "name: kept\nspace: {optimizer.lr: [1, 2\nn_trials: 3\n";
  EXPECT_REFUSED(study_run(path), 2, "malformed.yaml");
}

TEST_F(BadInput, UnknownKeys) {
  EXPECT_REFUSED(study_run(write_config("unknown.yaml", good_space(), "n_trails: 5\n")), 2, "n_trails");
  EXPECT_REFUSED(study_run(write_config("ok.yaml", good_space()), {"bogus=1"}), 2, "bogus");
  EXPECT_REFUSED(study_run(write_config("ok.yaml", good_space()), {"base.optimizer.lrr=0.1"}), 2, "lrr");
}

TEST_F(BadInput, WrongTypesAndOutOfRangeValues) {
  EXPECT_REFUSED(study_run(write_config("ok.yaml", good_space()), {"n_trials=many"}), 2, "n_trials");
  EXPECT_REFUSED(study_run(write_config("ok.yaml", good_space()), {"parallel=0"}), 2, "parallel");
  EXPECT_REFUSED(study_run(write_config("ok.yaml", good_space()), {"sampler=bayes"}), 2, "sampler");
  EXPECT_REFUSED(study_run(write_config("ok.yaml", good_space()), {"base.batch.global=-4"}), 2, "batch.global");
}

TEST_F(BadInput, StudyNameWithPathCharacters) {
  auto r = study_run(write_config("ok.yaml", good_space()), {"name=../x"});
  EXPECT_REFUSED(r, 2, "../x");
  EXPECT_FALSE(fs::exists(fs::path(dir_).parent_path() / "x"));
  auto s = test::run({test::bertsweep_bin(), "study", "status", "../kept", "--dir", dir_ + "/kept"});
  EXPECT_NE(s.exit_code, 0);
  EXPECT_NE(s.err.find("../kept"), std::string::npos) << s.err;
}

TEST_F(BadInput, SearchSpaceThatCannotBeSampled) {
  EXPECT_REFUSED(study_run(write_config("empty.yaml", "  optimizer.name: {choice: []}\n")), 2, "choice");
  EXPECT_REFUSED(study_run(write_config("lowhigh.yaml", "  optimizer.lr: {uniform: [0.1, 0.01]}\n")), 2, "low");
  EXPECT_REFUSED(study_run(write_config("nokey.yaml", "  optimizer.lrx: {uniform: [0.01, 0.1]}\n")), 2,
                 "optimizer.lrx");
}

TEST_F(BadInput, StudyFileThatIsNotAStudy) {
  fs::create_directories(dir_ + "/junk");
  std::string db = dir_ + "/junk/study.db";
  {
    std::mt19937 gen(5);
    std::ofstream out(db, std::ios::binary);
    for (int i = 0; i < 8192; ++i) out.put(static_cast<char>(gen() & 0xff));
  }
  std::string bytes = test::read_file(db);
  for (std::string sub : {"status", "resume"}) {
    auto r = test::run({test::bertsweep_bin(), "study", sub, "junk", "--dir", dir_});
    EXPECT_NE(r.exit_code, 0) << sub;
    EXPECT_NE(r.err.find("study.db"), std::string::npos) << sub << ": " << r.err;
    EXPECT_NE(r.err.find("not a"), std::string::npos) << sub << ": " << r.err;
  }
  EXPECT_EQ(test::read_file(db), bytes);
  fs::remove_all(dir_ + "/junk");
}

// The Optuna side of a finished study changed behind bertsweep's back (renamed with Optuna's API, a trial's
// state or value edited, the direction flipped, Optuna's tables dropped): `study resume` refuses before
// writing anything (exit 7, naming what disagrees), so the finished trial's row, its config.yaml and the
// whole file stay byte-identical and no backup or environment row is made.
TEST_F(BadInput, ResumeRefusesAStudyWhoseOptunaSideDisagrees) {
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"UPDATE studies SET study_name = 'kept-renamed'", "Optuna holds no study named 'kept'"},
      {"UPDATE trials SET state = 'PRUNED' WHERE number = 0", "trial 0 is COMPLETE in bs_trials but PRUNED"},
      {"UPDATE trials SET state = 'BOGUS' WHERE number = 0", "but BOGUS in Optuna's study"},
      {"UPDATE trial_values SET value = value + 1", "objective value in Optuna's study differs"},
      {"UPDATE study_directions SET direction = 'MAXIMIZE'", "direction is maximize"},
      {"DELETE FROM trials", "trial 0 is COMPLETE in bs_trials but not in Optuna's study"},
      {"DROP TABLE trials", "Optuna's tables (studies, trials) are missing"},
  };
  int i = 0;
  for (const auto& [sql, needle] : damages) {
    const std::string root = dir_ + "/optuna-damage-" + std::to_string(i++);
    fs::create_directories(root);
    fs::copy(dir_ + "/kept", root + "/kept", fs::copy_options::recursive);
    fs::remove(root + "/kept/study.db.bak");  // the fixture's own session took one
    {
      SQLite::Database db(root + "/kept/study.db", SQLite::OPEN_READWRITE);
      db.exec("PRAGMA foreign_keys = OFF");
      db.exec(sql);
    }
    const std::string before = test::folder_fingerprint(root);
    auto r = test::run({test::bertsweep_bin(), "study", "resume", "kept", "--dir", root}, 120);
    EXPECT_REFUSED(r, 7, needle);
    EXPECT_NE(r.err.find("nothing was written"), std::string::npos) << r.err;
    EXPECT_EQ(test::folder_fingerprint(root), before) << sql;
    EXPECT_FALSE(fs::exists(root + "/kept/study.db.bak")) << sql;
    fs::remove_all(root);
  }
}

// Damage that only Optuna notices (its schema version, a stored distribution): the storage layer's Python
// exception becomes bertsweep's words as the last line (file, cause, the .bak way back; exit 7), the
// traceback stays above it for a bug report, and the finished trial's row is untouched.
TEST_F(BadInput, OptunaStorageErrorsAreReportedInBertsweepsWords) {
  const std::vector<std::pair<std::string, std::string>> damages = {
      {"UPDATE alembic_version SET version_num = 'bogus'", "Optuna's storage cannot use"},
      {"UPDATE trial_params SET distribution_json = '{bad'", "is not one Optuna knows"},
  };
  int i = 0;
  for (const auto& [sql, needle] : damages) {
    const std::string root = dir_ + "/optuna-error-" + std::to_string(i++), db = root + "/kept/study.db";
    fs::create_directories(root);
    fs::copy(dir_ + "/kept", root + "/kept", fs::copy_options::recursive);
    {
      SQLite::Database d(db, SQLite::OPEN_READWRITE);
      d.exec(sql);
    }
    const TrialRecord before = StudyStore(db, StudyStore::Mode::kReadOnly).trial(0).value();
    auto r = test::run({test::bertsweep_bin(), "study", "resume", "kept", "--dir", root}, 120);
    EXPECT_EQ(r.exit_code, 7) << r.err;
    std::string last = r.err.substr(0, r.err.find_last_not_of('\n') + 1);
    last = last.substr(last.find_last_of('\n') + 1);
    EXPECT_NE(last.find(needle), std::string::npos) << "last line: " << last;
    EXPECT_NE(last.find(db + ".bak"), std::string::npos) << "last line: " << last;
    for (const char* raw : {"Traceback", "sqlalchemy", "Background on this error"})
      EXPECT_EQ(last.find(raw), std::string::npos) << "last line: " << last;
    EXPECT_NE(r.err.find("Traceback"), std::string::npos) << "the traceback is kept above";
    const TrialRecord after = StudyStore(db, StudyStore::Mode::kReadOnly).trial(0).value();
    EXPECT_EQ(after.state, before.state);
    EXPECT_EQ(after.values, before.values);
    EXPECT_EQ(after.config_yaml, before.config_yaml);
    fs::remove_all(root);
  }
}

// A stored config that no longer parses (the study's in bs_study, a trial's in bs_trials) is a study error in
// bertsweep's words (exit 7: the file, the table, the .bak way back), never yaml-cpp's text; nothing written.
TEST_F(BadInput, DamagedStoredYamlIsAStudyErrorNamingTheFile) {
  const std::string bin = test::bertsweep_bin();
  const std::vector<std::tuple<std::string, std::vector<std::string>, std::string>> damages = {
      {"UPDATE bs_trials SET config_yaml = 'a: b: c'", {"study", "export", "kept", "--best"}, "bs_trials.config_yaml"},
      {"UPDATE bs_study SET config_yaml = 'a: b: c'", {"study", "status", "kept"}, "bs_study"},
      {"UPDATE bs_study SET config_yaml = 'a: b: c'", {"study", "resume", "kept"}, "bs_study"},
      {"UPDATE bs_study SET config_yaml = 'a: b: c'", {"study", "export", "kept", "--best"}, "bs_study"},
  };
  int i = 0;
  for (const auto& [sql, cmd, needle] : damages) {
    const std::string root = dir_ + "/stored-yaml-" + std::to_string(i++);
    fs::create_directories(root);
    fs::copy(dir_ + "/kept", root + "/kept", fs::copy_options::recursive);
    {
      SQLite::Database db(root + "/kept/study.db", SQLite::OPEN_READWRITE);
      db.exec(sql);
    }
    const std::string before = test::folder_fingerprint(root);
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    argv.insert(argv.end(), {"--dir", root});
    auto r = test::run(argv, 120);
    EXPECT_REFUSED(r, 7, needle);
    EXPECT_NE(r.err.find("stored YAML is damaged"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(root + "/kept/study.db"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("study.db.bak"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("yaml-cpp"), std::string::npos) << r.err;
    EXPECT_EQ(test::folder_fingerprint(root), before) << sql << " / " << cmd[1];
    fs::remove_all(root);
  }
}

// A writing session copies study.db to study.db.bak before its first write; that copy brings back a study
// whose file is then destroyed.
TEST_F(BadInput, BackupBeforeResumeRestoresADestroyedStudy) {
  const std::string root = dir_ + "/backup";
  fs::create_directories(root);
  fs::copy(dir_ + "/kept", root + "/kept", fs::copy_options::recursive);
  fs::remove(root + "/kept/study.db.bak");
  const std::string bin = test::bertsweep_bin();
  auto status = test::run({bin, "study", "status", "kept", "--dir", root});
  ASSERT_EQ(status.exit_code, 0) << status.err;
  auto r = test::run({bin, "study", "resume", "kept", "--dir", root}, 120);  // budget spent: runs nothing
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_TRUE(fs::exists(root + "/kept/study.db.bak"));
  std::ofstream(root + "/kept/study.db", std::ios::binary | std::ios::trunc) << "destroyed";
  fs::remove(root + "/kept/study.db-wal");
  fs::remove(root + "/kept/study.db-shm");
  auto broken = test::run({bin, "study", "status", "kept", "--dir", root});
  EXPECT_EQ(broken.exit_code, 7) << broken.err;
  fs::copy_file(root + "/kept/study.db.bak", root + "/kept/study.db", fs::copy_options::overwrite_existing);
  auto back = test::run({bin, "study", "status", "kept", "--dir", root});
  EXPECT_EQ(back.exit_code, 0) << back.err;
  EXPECT_EQ(back.out, status.out);
  fs::remove_all(root);
}

// An export or report never writes into a study folder: not over study.db, not beside it (the TearDown
// checks that the study is byte for byte as it was).
TEST_F(BadInput, ExportAndReportNeverWriteIntoAStudyFolder) {
  const std::string bin = test::bertsweep_bin();
  for (const std::string& out :
       {dir_ + "/kept/study.db", dir_ + "/kept/study.db-wal", dir_ + "/kept/trials/best.yaml", dir_ + "/kept/x.yaml"}) {
    auto r = test::run({bin, "study", "export", "kept", "--best", "--dir", dir_, "--out", out});
    EXPECT_REFUSED(r, 7, "study");
    EXPECT_NE(r.err.find(out), std::string::npos) << r.err;
  }
  auto r = test::run({bin, "report", "kept", "--dir", dir_, "--out", dir_ + "/kept/report"});
  EXPECT_REFUSED(r, 7, "inside the study folder");
  EXPECT_FALSE(fs::exists(dir_ + "/kept/report"));
  // An absolute --out whose folder does not exist is a typo, not a request to create folders at the root.
  r = test::run(
      {bin, "study", "export", "kept", "--best", "--dir", dir_, "--out", "/nonexistent-bertsweep/dir/x.yaml"});
  EXPECT_REFUSED(r, 2, "does not exist");
  EXPECT_FALSE(fs::exists("/nonexistent-bertsweep"));
}

// Refused and read-only commands never create, migrate or write a study file: status, export and report of
// the kept study; confirm refused for an unknown --set key (no bs_confirm table appears); resume refused
// while another controller holds the study; and every command on a 0-byte study.db (it stays 0 bytes).
TEST_F(BadInput, RefusedAndReadOnlyCommandsWriteNothing) {
  const std::string bin = test::bertsweep_bin();
  EXPECT_EQ(test::run({bin, "study", "status", "kept", "--dir", dir_}).exit_code, 0);
  auto r = test::run({bin, "study", "export", "kept", "--best", "--dir", dir_});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_REFUSED(test::run({bin, "study", "confirm", "kept", "--seeds", "1", "--dir", dir_, "--set", "bogus.key=1"}), 2,
                 "bogus.key");
  EXPECT_REFUSED(test::run({bin, "study", "confirm", "kept", "--seeds", "1", "--include-unreached", "--dir", dir_,
                            "--set", "model.hidden=abc"}),
                 2, "model.hidden");
  {
    auto db = StudyStore::open_read_only(dir_ + "/kept/study.db");  // leaves no -wal/-shm behind
    EXPECT_FALSE(db->tableExists("bs_confirm"));
  }
  {  // another controller holds the study
    int fd = open((dir_ + "/kept/controller.lock").c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
    EXPECT_REFUSED(test::run({bin, "study", "resume", "kept", "--dir", dir_}, 60), 7, "another controller");
    close(fd);
  }

  fs::create_directories(dir_ + "/zero");
  std::ofstream(dir_ + "/zero/study.db").close();
  for (std::vector<std::string> cmd : {std::vector<std::string>{"study", "status", "zero"},
                                       {"study", "resume", "zero"},
                                       {"study", "export", "zero", "--best"},
                                       {"study", "confirm", "zero", "--seeds", "1"},
                                       {"report", "zero", "--out", dir_ + "/zero-report"}}) {
    std::vector<std::string> argv = {bin};
    argv.insert(argv.end(), cmd.begin(), cmd.end());
    argv.insert(argv.end(), {"--dir", dir_});
    auto z = test::run(argv, 60);
    EXPECT_REFUSED(z, 7, "0 bytes");
    EXPECT_EQ(fs::file_size(dir_ + "/zero/study.db"), 0u) << cmd[1];
  }
  EXPECT_FALSE(fs::exists(dir_ + "/zero-report"));
  fs::remove_all(dir_ + "/zero");
}

// Launcher safety: a study config (perhaps from someone else's study folder) cannot make the controller run
// another program or a shell.
TEST_F(BadInput, LauncherThatWouldRunSomethingElseIsRefused) {
  EXPECT_REFUSED(study_run(write_config("sh.yaml", good_space(), "launcher: {kind: sh}\n")), 2, "launcher.kind");
  EXPECT_REFUSED(study_run(write_config("meta.yaml", good_space(),
                                        "launcher: {kind: mpirun, extra_args: ['--np 2; touch /tmp/owned']}\n")),
                 2, "extra_args");
  EXPECT_REFUSED(study_run(write_config("agent.yaml", good_space(),
                                        "launcher: {kind: mpirun, extra_args: [--launch-agent, /tmp/evil]}\n")),
                 2, "--launch-agent");
  EXPECT_REFUSED(study_run(write_config("prolog.yaml", good_space(),
                                        "launcher: {kind: srun, extra_args: ['--task-prolog=/tmp/evil']}\n")),
                 2, "--task-prolog");
  EXPECT_REFUSED(study_run(write_config("host.yaml", good_space(), "launcher: {kind: mpirun, hostfile: '$(id)'}\n")), 2,
                 "hostfile");
  // The launcher itself: argument vectors through execve/execvpe, never a shell.
  std::string src = test::read_file(test::source_dir() + "/search/TrialLauncher.cpp");
  ASSERT_FALSE(src.empty());
  EXPECT_NE(src.find("execve("), std::string::npos);
  for (const char* shell : {"system(", "popen(", "/bin/sh", "\"-c\""})
    EXPECT_EQ(src.find(shell), std::string::npos) << shell;
}

// Training-side bad input: a truncated shard, a vocab too small for the data, a checkpoint of another model.
class BadTrainingInput : public ::testing::Test {
 protected:
  std::vector<std::string> train(const std::string& data, const std::vector<std::string>& sets) {
    std::vector<std::string> a = {test::bertsweep_bin(), "train", "--config",
                                  test::source_dir() + "/configs/train/bert-tiny-brown.yaml", "--quiet"};
    std::vector<std::string> all = {"data.dir=" + data,     "target.max_samples=64", "target.eval_every_samples=32",
                                    "data.eval_samples=32", "batch.global=16",       "batch.micro=16"};
    all.insert(all.end(), sets.begin(), sets.end());
    for (const auto& s : all) a.insert(a.end(), {"--set", s});
    return a;
  }
};

TEST_F(BadTrainingInput, TruncatedShard) {
  std::string copy = test::make_temp_dir("rel-truncated");
  fs::copy(test::small_brown_dataset(), copy, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  std::string shard = copy + "/train_00000.hdf5";
  fs::resize_file(shard, fs::file_size(shard) / 2);
  auto r = test::run(train(copy, {}), 120);
  EXPECT_REFUSED(r, 3, "train_00000.hdf5");
  fs::remove_all(copy);
}

TEST_F(BadTrainingInput, VocabSmallerThanTheData) {
  auto r = test::run(train(test::small_brown_dataset(), {"model.vocab_size=100"}), 120);
  EXPECT_REFUSED(r, 2, "model.vocab_size");
}

TEST_F(BadTrainingInput, CheckpointOfAnotherModel) {
  std::string ckpt = test::make_temp_dir("rel-ckpt");
  auto first =
      test::run(train(test::small_brown_dataset(), {"checkpoint.dir=" + ckpt, "checkpoint.every_samples=32"}), 180);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  ASSERT_FALSE(fs::is_empty(ckpt)) << "no checkpoint written";
  std::string before = test::folder_fingerprint(ckpt);
  std::vector<std::string> resume =
      train(test::small_brown_dataset(), {"checkpoint.dir=" + ckpt, "model.hidden=64", "model.intermediate=256"});
  resume.push_back("--resume");
  auto r = test::run(resume, 180);
  EXPECT_REFUSED(r, 3, ckpt);
  EXPECT_NE(r.err.find("different model"), std::string::npos) << r.err;
  EXPECT_EQ(test::folder_fingerprint(ckpt), before) << "the refused resume changed the checkpoint";
  fs::remove_all(ckpt);
}
