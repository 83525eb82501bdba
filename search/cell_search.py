"""Per-cell sampling and pruning of stratified studies (compiled into bs_search as a string, run in the
embedded interpreter by search/OptunaBridge.cpp).

C++ owns the flow (which cell, the seed, asking, recording the trial in the study file); this module only
selects a cell's trials, builds the in-memory study a cell's sampler sees, and holds the cell-wise median
pruner. A cell is a dict {stratify key: value}; a trial is in it when its params hold exactly those values.
"""
import statistics

import optuna
from optuna.trial import TrialState

# A cell sampler's own state (CMA-ES keeps its optimizer in trial system attrs) rides along in the main
# study's trial under this prefix, apart from what the main study's sampler writes there.
_STATE_PREFIX = "bs_cell:"
# Optuna's own record of enqueued values: not sampler state.
_NOT_STATE = ("fixed_params",)


def _same(a, b):
    # Strict: True == 1 in Python, but a bool choice is not an int choice.
    return type(a) is type(b) and a == b


def in_cell(trial, cell):
    return all(k in trial.params and _same(trial.params[k], v) for k, v in cell.items())


def _finished(trial):
    if trial.state == TrialState.COMPLETE:
        return trial.values is not None
    return trial.state == TrialState.PRUNED and len(trial.intermediate_values) > 0


def finished_in_cell(study, cell):
    """The cell's COMPLETE trials (with values) and PRUNED ones (with intermediate values), in trial order."""
    return [t for t in study.get_trials(deepcopy=False) if in_cell(t, cell) and _finished(t)]


def started_in_cell(study, cell):
    """How many trials the cell has been given (any state but WAITING)."""
    return sum(1 for t in study.get_trials(deepcopy=False) if t.state != TrialState.WAITING and in_cell(t, cell))


def _copy_for_cell(trial):
    state = {k[len(_STATE_PREFIX):]: v for k, v in trial.system_attrs.items() if k.startswith(_STATE_PREFIX)}
    return optuna.trial.create_trial(
        state=trial.state,
        values=trial.values if trial.state == TrialState.COMPLETE else None,
        params=trial.params,
        distributions=trial.distributions,
        intermediate_values=trial.intermediate_values,
        system_attrs=state,
    )


def cell_study(main_study, history, sampler):
    """A fresh in-memory study (the main study's directions) holding `history`, sampled by `sampler`."""
    study = optuna.create_study(
        directions=main_study.directions, sampler=sampler, pruner=optuna.pruners.NopPruner()
    )
    for t in history:
        study.add_trial(_copy_for_cell(t))
    return study


def keep_sampler_state(cell_study_, cell_trial, main_study, main_number):
    """Copies what the cell sampler stored with `cell_trial` onto the main study's trial `main_number`."""
    attrs = cell_study_._storage.get_trial(cell_trial._trial_id).system_attrs
    storage = main_study._storage
    trial_id = storage.get_trial_id_from_study_id_trial_number(main_study._study_id, main_number)
    for k, v in attrs.items():
        if k not in _NOT_STATE:
            storage.set_trial_system_attr(trial_id, _STATE_PREFIX + k, v)


def _value_at(trial, step):
    """The trial's intermediate value at `step`, or its last one before it (carried forward); None if none."""
    steps = [s for s in trial.intermediate_values if s <= step]
    return trial.intermediate_values[max(steps)] if steps else None


class CellMedianPruner(optuna.pruners.BasePruner):
    """MedianPruner within a cell: the running trial is compared only with the COMPLETE trials that share
    its stratify values, since comparing across cells (other batch sizes, other optimizers) is what a
    stratified study measures. A completed trial that stopped before the step (it reached the target
    early) counts with its last value: it would only have improved.
    """

    def __init__(self, stratify_keys, n_startup_trials=2):
        self._keys = list(stratify_keys)
        self._n_startup_trials = n_startup_trials

    def prune(self, study, trial):
        step = trial.last_step
        if step is None:
            return False
        cell = {k: trial.params[k] for k in self._keys if k in trial.params}
        done = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.number != trial.number and in_cell(t, cell)
        ]
        if len(done) < self._n_startup_trials:
            return False
        minimize = study.direction == optuna.study.StudyDirection.MINIMIZE
        mine = [v for s, v in trial.intermediate_values.items() if s <= step and v == v]
        if not mine:  # only NaN so far: pruned, as MedianPruner does
            return True
        best = min(mine) if minimize else max(mine)
        others = [_value_at(t, step) for t in done]
        others = [v for v in others if v is not None and v == v]
        if not others:
            return False
        median = statistics.median(others)
        return best > median if minimize else best < median
