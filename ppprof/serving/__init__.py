"""Serving under load (`ppprof serve-bench`): the prefill scheduler of a pipeline-parallel server (`scheduler`), its
discrete-event simulation on a latency model (`simulate`), the arms as sizers (`arms`), the load levels (`levels`) and
the plots (`plots`). Pure: no torch."""
