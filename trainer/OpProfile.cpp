#include "trainer/OpProfile.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <vector>

namespace bs {
namespace {

using Clock = std::chrono::steady_clock;

struct Totals {
  int64_t calls = 0;
  double self_s = 0;
};

// One profile at a time per process (the trainer's); the callback reaches it through these globals.
struct State {
  std::mutex mu;
  std::map<std::string, Totals> by_op;
  bool on = false;
  Clock::time_point window_start;
  double wall_s = 0;
};
State& state() {
  static State s;
  return s;
}

struct Frame {
  Clock::time_point start;
  double child_s = 0;
  std::string scope;  // the innermost enclosing bertsweep scope ("bs::optimizer_step"), or empty
};
thread_local std::vector<Frame> t_stack;

std::unique_ptr<at::ObserverContext> on_enter(const at::RecordFunction& fn) {
  std::string scope = t_stack.empty() ? std::string() : t_stack.back().scope;
  if (fn.scope() == at::RecordScope::USER_SCOPE) scope = fn.name();
  t_stack.push_back({Clock::now(), 0, std::move(scope)});
  return nullptr;
}

void on_exit(const at::RecordFunction& fn, at::ObserverContext*) {
  if (t_stack.empty()) return;  // entered before the callback was installed
  const Frame f = t_stack.back();
  t_stack.pop_back();
  const double total = std::chrono::duration<double>(Clock::now() - f.start).count();
  if (!t_stack.empty()) t_stack.back().child_s += total;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.on) return;
  // An op inside a bertsweep scope is filed under it ("bs::optimizer_step/aten::mul_"): the classes of
  // bench/op_profile.py (optimizer, data path, ...) need where an op ran, not only what it is.
  const std::string name = fn.name();
  Totals& t = s.by_op[f.scope.empty() || f.scope == name ? name : f.scope + "/" + name];
  t.calls += 1;
  t.self_s += total - f.child_s;
}

}  // namespace

OpProfile::OpProfile() { handle_ = at::addGlobalCallback(at::RecordFunctionCallback(on_enter, on_exit)); }

OpProfile::~OpProfile() {
  stop();
  at::removeCallback(handle_);
}

void OpProfile::start() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.on) return;
  s.on = true;
  s.window_start = Clock::now();
}

void OpProfile::stop() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.on) return;
  s.on = false;
  s.wall_s += std::chrono::duration<double>(Clock::now() - s.window_start).count();
}

bool OpProfile::running() const {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.on;
}

void OpProfile::write_tsv(const std::string& path) const {
  State& s = state();
  std::vector<std::pair<std::string, Totals>> rows;
  double wall = 0, in_ops = 0;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    rows.assign(s.by_op.begin(), s.by_op.end());
    wall = s.wall_s + (s.on ? std::chrono::duration<double>(Clock::now() - s.window_start).count() : 0);
  }
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.self_s > b.second.self_s; });
  std::ofstream out(path);
  if (!out)
    throw std::runtime_error("log.op_profile: cannot write " + path + " (check the folder exists and is writable)");
  out << "op\tcalls\tself_seconds\n";
  for (const auto& [name, t] : rows) {
    out << name << '\t' << t.calls << '\t' << t.self_s << '\n';
    in_ops += t.self_s;
  }
  // Time of the profiled window not inside any recorded op on the threads that record (the main thread; the
  // intra-op pool's workers run inside their op's call): Python-free host glue, the loop's own bookkeeping.
  out << "(outside any op)\t0\t" << std::max(0.0, wall - in_ops) << '\n';
  out << "(profiled wall)\t0\t" << wall << '\n';
  if (!out) throw std::runtime_error("log.op_profile: writing " + path + " failed");
}

}  // namespace bs
