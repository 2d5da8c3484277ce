"""Probes: synthetic prefill requests, the lockstep probe loop of one rank, and timers."""
