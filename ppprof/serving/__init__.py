"""Serving under load (being built, for a serving bench): the prefill scheduler of a pipeline-parallel server
(`scheduler`) and its discrete-event simulation on a latency model (`simulate`). Pure: no torch."""
