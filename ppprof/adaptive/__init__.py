"""The adaptive probe design, in one package: its pure parts (design: the initial design and each next batch;
uncertainty: the bootstrap of the tables and predicted TTFT; status: the status the profile's fit would write and
whether it is sure; stop: the stopping rule; probes: the candidate grid and the check before launch; step: rank
0's choice on the rows the policy's fit reads) below its one rank-side module (loop: the sequence of probes).

`check(cfg)` is what the pre-launch checks call; `initial_probes(cfg)` the probes a profile starts with."""

from ppprof.adaptive.probes import check, initial_probes

__all__ = ["check", "initial_probes"]
