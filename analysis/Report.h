// `bertsweep report`: report.md and report.html (plots as PNG files next to them; the HTML also embeds
// each PNG as base64, so it is self-contained and still links the file) for one or more studies.
#pragma once
#include <string>
#include <vector>

#include "analysis/BatchScaling.h"
#include "common/TrainConfig.h"

namespace bs::analysis {

struct ReportOptions {
  std::vector<std::string> studies;  // names under `dir`
  std::string dir = "studies";
  std::string out_dir;
  ClusterModel cluster;  // the modelled time to train of a study confirmed per batch
};

struct ReportFiles {
  std::string markdown, html;
  std::vector<std::string> images;  // PNG paths written
};

// Throws StudyError for an unknown study.
ReportFiles write_report(const ReportOptions& options);

// How every number of the report tables is written: integral values as integers, others with 6
// significant digits; "-" for none.
std::string format_number(double v);
// A schedule's warmup as configured: "N steps", or "f of the schedule" when it is a fraction (steps -1).
std::string warmup_text(const ScheduleConfig& schedule);
std::string base64(const std::string& bytes);

}  // namespace bs::analysis
