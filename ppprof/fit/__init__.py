"""Fitting latency models to timed samples and turning them into a policy file (scikit-learn; no torch).

The fit is one function, `fit_samples(RunSamples, settings, options)` -> (contract, report), over samples held in
memory: `ppprof profile` hands it the rows it measured (`fit_and_save`); `ppprof fit` calls `fit(samples_path, ...)`,
which reads the checkpoint files first.
"""

from ppprof.fit.build import fit, fit_and_save, fit_run, fit_samples
from ppprof.fit.fitted import Report, RunSamples, document
from ppprof.fit.samples import Samples, read_run, read_samples
from ppprof.fit.settings import resolve_settings
from ppprof.fit.summary import fit_summary

__all__ = [
    "Report",
    "RunSamples",
    "Samples",
    "document",
    "fit",
    "fit_and_save",
    "fit_run",
    "fit_samples",
    "read_run",
    "read_samples",
    "resolve_settings",
    "fit_summary",
]
