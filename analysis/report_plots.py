"""Plots of a bertsweep study report (compiled into bs_analysis as a string, run in the embedded interpreter).

Only drawing and Optuna's importance evaluators live here; every table number is computed in C++.
Each plot function writes one PNG and returns nothing; importance() returns a dict.
"""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402

_DPI = 100


def _save(fig, path):
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI)
    plt.close(fig)


def convergence(path, curves, target, title):
    """curves: [{"label": str, "samples": [..], "accuracy": [..]}]; target: the target accuracy."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c in curves:
        ax.plot(c["samples"], c["accuracy"], marker="o", markersize=3, label=c["label"])
    if target > 0:
        ax.axhline(target, color="gray", linestyle="--", linewidth=1, label="target %.3g" % target)
    ax.set_xlabel("training samples")
    ax.set_ylabel("eval masked-LM accuracy")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if curves:
        ax.legend(fontsize=8)
    _save(fig, path)


def pareto(path, points, front, title):
    """points: [(batch, samples_to_target, optimizer)]; front: [(batch, samples_to_target)] sorted by batch."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    by_opt = {}
    for b, s, o in points:
        by_opt.setdefault(o, ([], []))
        by_opt[o][0].append(b)
        by_opt[o][1].append(s)
    for o, (bs, ss) in sorted(by_opt.items()):
        ax.scatter(bs, ss, label=o, alpha=0.8)
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], drawstyle="steps-post", color="black", linewidth=1.5,
                marker="o", markersize=12, markerfacecolor="none", label="Pareto front")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("global batch size")
    ax.set_ylabel("samples to target")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if points:
        ax.legend(fontsize=8)
    _save(fig, path)


def history(path, trials, states, values, best, metric, title):
    """values/best: per finished trial, None where a trial has no value (pruned, failed)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    colors = {"COMPLETE": "tab:blue", "PRUNED": "tab:orange", "FAIL": "tab:red"}
    for state, color in colors.items():
        xs = [t for t, s, v in zip(trials, states, values) if s == state and v is not None]
        ys = [v for t, s, v in zip(trials, states, values) if s == state and v is not None]
        if xs:
            ax.scatter(xs, ys, color=color, label=state.lower())
    bx = [t for t, b in zip(trials, best) if b is not None]
    by = [b for b in best if b is not None]
    if bx:
        ax.step(bx, by, where="post", color="black", label="best so far")
    skipped = [t for t, v in zip(trials, values) if v is None]
    if skipped:
        ax.text(0.01, 0.98, "no value (pruned or failed): trials %s" % ", ".join(str(t) for t in skipped[:20]),
                transform=ax.transAxes, va="top", fontsize=7)
    ax.set_xlabel("trial")
    ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
    ax.set_ylabel(metric)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    if bx:
        ax.legend(fontsize=8)
    _save(fig, path)


def confirm(path, groups, title):
    """groups: [(optimizer, [samples_to_target of each seed that reached the target])]."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labels = [g[0] for g in groups]
    data = [g[1] for g in groups]
    ax.boxplot(data, labels=labels, showmeans=True)
    for i, d in enumerate(data, start=1):
        ax.scatter([i] * len(d), d, color="tab:blue", alpha=0.6, zorder=3)
    ax.set_ylabel("samples to target")
    ax.set_title(title)
    ax.grid(True, axis="y", alpha=0.3)
    _save(fig, path)


def confirm_vs_batch(path, series, title):
    """series: [(optimizer, [batch], [mean], [std], [runs that reached])]; one line per optimizer with error
    bars of one standard deviation over the seeds; x on a log2 scale."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, batches, means, stds, ns in series:
        if not batches:
            continue
        ax.errorbar(batches, means, yerr=stds, marker="o", capsize=4, label=name)
        for b, m, n in zip(batches, means, ns):
            ax.annotate("n=%d" % n, (b, m), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_xlabel("global batch size")
    ax.set_ylabel("samples to target (mean +- std over seeds)")
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _log_axes(ax, xbase):
    """Log x (base xbase) and log10 y with plain numbers at 1, 2, 5 x 10^k (no 10^k notation)."""
    plain = matplotlib.ticker.FuncFormatter(lambda v, _: "%g" % v)
    ax.set_xscale("log", base=xbase)
    ax.set_yscale("log")
    ax.xaxis.set_major_formatter(plain)
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def batch_scaling(path, series, title):
    """series: [{"optimizer", "batch", "samples_mean", "samples_std", "steps_mean", "steps_std", "reached",
    "runs"}]; two log-log panels (samples to target, steps to target vs global batch), one line per optimizer,
    error bars of one standard deviation over the seeds that reached; "k/n" where only k of n runs reached."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    panels = (("samples_mean", "samples_std", "samples to target"), ("steps_mean", "steps_std", "steps to target"))
    for ax, (mean_key, std_key, label) in zip(axes, panels):
        for s in series:
            if not s["batch"]:
                continue
            ax.errorbar(s["batch"], s[mean_key], yerr=s[std_key], marker="o", capsize=4, label=s["optimizer"])
            for b, m, k, n in zip(s["batch"], s[mean_key], s["reached"], s["runs"]):
                if k < n:
                    ax.annotate("%d/%d" % (k, n), (b, m), textcoords="offset points", xytext=(4, 4), fontsize=7)
        _log_axes(ax, 2)
        ax.set_xlabel("global batch size")
        ax.set_ylabel(label + " (mean +- std over seeds)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    _save(fig, path)


def time_to_train(path, series, title):
    """series: [(optimizer, [devices], [seconds], [batch chosen])]; log-log, one line per optimizer, each
    marker labelled with the global batch that gives that optimizer its shortest modelled time."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, devices, seconds, batches in series:
        if not devices:
            continue
        line = ax.plot(devices, seconds, marker="o", label=name)[0]
        for n, t, b in zip(devices, seconds, batches):
            ax.annotate("B=%d" % b, (n, t), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=line.get_color())
    _log_axes(ax, 2)
    ax.set_xlabel("devices N (data parallel)")
    ax.set_ylabel("modelled time to train (s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    _save(fig, path)


def _read_only_url(db_path):
    """An SQLAlchemy URL that opens db_path so that nothing can be written: Optuna's storage would otherwise
    stamp or create its version tables in a file that lacks them. Immutable while no WAL exists (no -shm is
    made either), else plain read-only so that a running controller's WAL is read."""
    import os
    import urllib.parse

    path = urllib.parse.quote(os.path.abspath(db_path))
    mode = "mode=ro" if os.path.exists(db_path + "-wal") else "immutable=1"
    return "sqlite:///file:%s?%s&uri=true" % (path, mode)


def importance(db_path, study_name, path, title):
    """Optuna's parameter importances of the study in db_path (read-only).

    Returns {"evaluator": name, "importances": [(param, value)...]} and writes a bar chart to path, or
    {"message": why there is none}.
    """
    import optuna

    import sqlite3

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        con = sqlite3.connect(_read_only_url(db_path)[len("sqlite:///"):].replace("&uri=true", ""), uri=True)
        try:
            has_tables = con.execute(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name IN ('studies', 'trials')"
            ).fetchone()[0] == 2
        finally:
            con.close()
    except sqlite3.Error as e:
        return {"message": "no Optuna study in the file (%s)" % type(e).__name__}
    if not has_tables:
        return {"message": "no Optuna study in the file"}
    try:
        storage = optuna.storages.RDBStorage(_read_only_url(db_path), skip_table_creation=True)
        names = [s.study_name for s in optuna.study.get_all_study_summaries(storage, include_best_trial=False)]
        if not names:
            return {"message": "no Optuna study in the file"}
        study = optuna.load_study(study_name=study_name if study_name in names else names[0], storage=storage)
        trials = study.get_trials(deepcopy=False)
    except Exception as e:  # no or damaged Optuna tables: the report goes on without this figure
        return {"message": "Optuna's tables in the file cannot be read (%s)" % type(e).__name__}
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    if len(done) < 2:
        return {"message": "not enough trials (%d complete; importance needs at least 2)" % len(done)}
    target = (lambda t: t.values[0]) if len(study.directions) > 1 else None
    errors = []
    for name in ("FanovaImportanceEvaluator", "MeanDecreaseImpurityImportanceEvaluator"):
        try:
            evaluator = getattr(optuna.importance, name)(seed=0)
            imp = optuna.importance.get_param_importances(study, evaluator=evaluator, target=target)
        except Exception as e:  # missing sklearn, too few distinct values, ...
            errors.append("%s: %s" % (name, e))
            continue
        if not imp:
            return {"message": "no parameter varies across the complete trials"}
        items = sorted(imp.items(), key=lambda kv: kv[1])
        fig, ax = plt.subplots(figsize=(7, 0.5 * len(items) + 1.5))
        ax.barh([k for k, _ in items], [v for _, v in items], color="tab:blue")
        ax.set_xlabel("importance (%s)" % name.replace("ImportanceEvaluator", ""))
        ax.set_title(title)
        _save(fig, path)
        return {"evaluator": name, "importances": [(k, float(v)) for k, v in reversed(items)]}
    return {"message": "importance not available: " + "; ".join(errors)}
