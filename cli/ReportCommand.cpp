// `report`: parse options, call analysis/Report.
#include <iostream>

#include "analysis/Report.h"
#include "cli/Args.h"
#include "cli/Commands.h"
#include "common/Errors.h"
#include "common/TrainConfig.h"
#include "studies/ConfigExport.h"

namespace bs::cli {

namespace {
const char* kHelp = R"(usage: bertsweep report NAME [NAME...] --out DIR [--dir studies/]

Writes DIR/report.md and DIR/report.html for the named studies, with PNG plots as files in DIR
(NAME-convergence.png, NAME-pareto.png, NAME-history.png, NAME-importance.png, NAME-confirm.png).
report.md links the PNG files; report.html embeds each PNG as base64 (self-contained: it can be mailed
alone) and links the file next to it.

Per study: trial counts by state (complete, reached, pruned, failed); per optimizer x batch size the best,
mean and standard deviation of samples to target; the best trial per optimizer and its convergence curve
(eval accuracy vs samples); the Pareto front of samples to target vs batch size; the optimisation history;
Optuna's hyperparameter importance (fANOVA, else mean decrease impurity, else the reason there is none);
the `study confirm` results (mean +- std over seeds) when present; the environment of the latest session.

exit codes: 0 ok, 2 usage error, 7 unknown study
)";
}  // namespace

int report_command(const Argv& args) {
  Args a(args, {"help"});
  if (a.has("help")) {
    std::cout << kHelp;
    return exit_code::kOk;
  }
  a.allow_only({"out", "dir", "help"});
  if (a.positional().empty()) throw UsageError("give at least one study NAME");
  analysis::ReportOptions o;
  o.studies = a.positional();
  o.dir = a.get("dir", "studies");
  o.out_dir = a.require("out");
  try {
    const auto files = analysis::write_report(o);
    std::cerr << "bertsweep report: wrote " << files.markdown << ", " << files.html << " and " << files.images.size()
              << " plot(s)\n";
    std::cout << files.html << "\n";
  } catch (const Error& e) {  // an unknown study (7), a bad option or config (2)
    std::cerr << describe(e, "bertsweep report") << "\n";
    return e.exit_code();
  } catch (const std::runtime_error& e) {  // a damaged study file (fs errors name the path)
    std::cerr << "bertsweep report: " << e.what() << "\n";
    return exit_code::kStudy;
  } catch (const std::invalid_argument& e) {  // a stored value that is not a number
    std::cerr << "bertsweep report: a stored value could not be read (" << e.what() << "); the study file is damaged\n";
    return exit_code::kStudy;
  }
  return exit_code::kOk;
}

}  // namespace bs::cli
