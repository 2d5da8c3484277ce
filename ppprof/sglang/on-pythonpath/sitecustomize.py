"""Put first on PYTHONPATH by `python -m ppprof.sglang`, so that every Python process of the server (SGLang's spawned
schedulers inherit PYTHONPATH and PPPROF_POLICY) installs ppprof's SGLang hook at start; then runs the sitecustomize
this one shadows, if there is one."""

from ppprof.sglang.hook import install, run_shadowed_sitecustomize

install()
run_shadowed_sitecustomize(__file__)
