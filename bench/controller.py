#!/usr/bin/python3
"""Controller overhead, two ways:
  A. a small real study (the smoke study's settings, adam only, parallel 1): controller wall time vs the trials' own
     start/end times from study.db (bs_trials), i.e. what Optuna ask/tell + store writes + launching cost per trial;
  B. Optuna alone on a SQLite study (TPE, the smoke study's search space): ms per ask+tell over the 10 trials
     ending at trial 10, 100 and 1000, to show how it grows with the study size.
Writes bench/results/controller.{json,csv,md}.

  bench/controller.py [--trials 4]
"""
import argparse
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchlib as bl  # noqa: E402


# The smoke study (configs/studies/smoke.yaml) with optimizer.name restricted to adam: LAMB trials crashed with
# SIGSEGV in the build benchmarked on 2026-12-02 (see BENCHMARKS.md), which would turn trials into 1 s failures.
STUDY = """name: overhead
objective: samples_to_target
sampler: tpe
pruner: median
n_trials: 4
parallel: 1
seed: 3
trial_timeout: 300
base:
  extends: {root}/configs/train/bert-tiny-brown.yaml
  data: {{dir: {root}/data/brown, eval_samples: 128}}
  batch: {{global: 32, micro: 16}}
  target: {{mlm_accuracy: 0.035, max_samples: 1536, eval_every_samples: 512}}
space:
  optimizer.name: {{choice: [adam]}}
  optimizer.lr: {{log_uniform: [1.0e-3, 1.0e-2]}}
  batch.global: {{choice: [16, 32]}}
launcher: {{kind: local}}
"""


def real_study(n_trials):
    d = tempfile.mkdtemp(prefix="bs-bench-study-")
    cfg = os.path.join(d, "overhead.yaml")
    with open(cfg, "w") as f:
        f.write(STUDY.format(root=bl.ROOT))
    cmd = [bl.binary(), "study", "run", "--config", cfg, "--name", "overhead", "--dir", d,
           "--set", f"n_trials={n_trials}", "--quiet"]
    t0 = time.time()
    p = subprocess.run(cmd, cwd=bl.ROOT, capture_output=True, text=True, timeout=1800)
    t1 = time.time()
    if p.returncode != 0:
        raise RuntimeError(f"study run failed ({p.returncode}): {p.stderr[-2000:]}")
    db = sqlite3.connect(os.path.join(d, "overhead", "study.db"))
    trials = db.execute("SELECT number, state, start_time, end_time FROM bs_trials ORDER BY number").fetchall()
    db.close()
    shutil.rmtree(d, ignore_errors=True)
    durations = [e - s for _, _, s, e in trials if s and e]
    first_start = min(s for _, _, s, _ in trials if s)
    last_end = max(e for _, _, _, e in trials if e)
    wall = t1 - t0
    in_trials = sum(durations)
    return {"command": " ".join(cmd), "trials": len(trials), "states": sorted({t[1] for t in trials}),
            "controller_wall_s": wall, "sum_trial_s": in_trials, "mean_trial_s": in_trials / len(durations),
            "startup_s": first_start - t0, "shutdown_s": t1 - last_end,
            "between_trials_s_per_trial": (last_end - first_start - in_trials) / max(1, len(durations) - 1),
            "overhead_s_per_trial": (wall - in_trials) / len(durations),
            "overhead_fraction": (wall - in_trials) / wall}


def optuna_growth(marks=(10, 100, 1000), window=10):
    """ms per ask+tell over the `window` trials ending at each mark. The trials between the windows are added
    as finished trials with random parameters (add_trials), so the study really holds `mark` trials in SQLite
    when each window is timed, without paying for TPE on every filler trial."""
    import random
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    d = tempfile.mkdtemp(prefix="bs-bench-optuna-")
    study = optuna.create_study(storage=f"sqlite:///{d}/s.db", study_name="g", direction="minimize",
                                sampler=optuna.samplers.TPESampler(seed=3))
    dists = {"optimizer.name": CategoricalDistribution(["adam", "lamb"]),
             "optimizer.lr": FloatDistribution(1e-3, 1e-2, log=True),
             "batch.global": CategoricalDistribution([16, 32])}
    rnd = random.Random(3)

    def objective(name, lr, bsz):
        return (lr - 3e-3) ** 2 * 1e6 + bsz + (1 if name == "lamb" else 0)

    rows = []
    t_fill = 0.0
    for m in marks:
        fill = m - window - len(study.trials)
        if fill > 0:
            t = time.perf_counter()
            frozen = []
            for _ in range(fill):
                p = {"optimizer.name": rnd.choice(["adam", "lamb"]), "optimizer.lr": 10 ** rnd.uniform(-3, -2),
                     "batch.global": rnd.choice([16, 32])}
                frozen.append(optuna.trial.create_trial(params=p, distributions=dists,
                                                        value=objective(*p.values())))
            study.add_trials(frozen)
            t_fill += time.perf_counter() - t
        asks, totals = [], []
        for _ in range(window):
            t = time.perf_counter()
            tr = study.ask()
            name = tr.suggest_categorical("optimizer.name", ["adam", "lamb"])
            lr = tr.suggest_float("optimizer.lr", 1e-3, 1e-2, log=True)
            bsz = tr.suggest_categorical("batch.global", [16, 32])
            asks.append(time.perf_counter() - t)
            study.tell(tr, objective(name, lr, bsz))
            totals.append(time.perf_counter() - t)
        rows.append({"at_trial": len(study.trials), "ask_ms": 1000 * sum(asks) / window,
                     "ask_tell_ms": 1000 * sum(totals) / window})
        print(rows[-1], flush=True)
    shutil.rmtree(d, ignore_errors=True)
    return {"optuna": optuna.__version__, "sampler": "TPE(seed=3)", "storage": "sqlite", "window": window,
            "fill_seconds": t_fill, "rows": rows}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=4)
    a = ap.parse_args()
    info = bl.machine()
    study = real_study(a.trials)
    print(study, flush=True)
    growth = optuna_growth()
    rows = [dict(r, source="optuna sqlite TPE") for r in growth["rows"]]
    print(growth, flush=True)
    bl.write_results("controller", {"machine": info, "real_study": study, "optuna_growth": growth,
                                    "loadavg_at_end": os.getloadavg()}, rows,
                     ["source", "at_trial", "ask_ms", "ask_tell_ms"])


if __name__ == "__main__":
    main()
