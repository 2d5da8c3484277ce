"""Fitting latency models to timed samples and turning them into a policy file (scikit-learn; no torch).

`ppprof profile` calls `fit_run(run_dir)` at its end; `ppprof fit` calls `fit(samples_path, ...)`.
"""

from ppprof.fit.build import fit, fit_run, fit_samples
from ppprof.fit.samples import Samples, read_run, read_samples
from ppprof.fit.settings import resolve_settings
from ppprof.fit.summary import fit_summary

__all__ = ["Samples", "fit", "fit_run", "fit_samples", "read_run", "read_samples", "resolve_settings", "fit_summary"]
