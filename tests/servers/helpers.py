"""Models and policies the server tests share."""

from ppprof.policy import LatencyModel
from tests.policy.policy_helpers import policy_dict

PREFIX = LatencyModel("prefix", a=1.5e-6, b=0.01, c=2.0, g=4e-4)
QUADRATIC = LatencyModel("quadratic", a=1.5e-6, b=0.01, c=2.0)

__all__ = ["PREFIX", "QUADRATIC", "policy_dict", "root"]


def root(a, b, target):
    """The documented equal-latency root: a x^2 + b x - target = 0."""
    import math

    return (-b + math.sqrt(b * b + 4 * a * target)) / (2 * a)
