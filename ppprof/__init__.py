"""ppprof: pipeline-parallel prefill profiler and dynamic chunk-size policy generator."""

__version__ = "0.1.0"
