"""Replaying load traces through the operator's policy and the baselines (`gpusizer simulate`).

The policy names live here, apart from the numpy simulator: every `gpusizer run` builds the
whole command line, `simulate`'s options included.
"""

POLICIES = ("gpusizer", "hpa", "keda", "keda-queue", "static", "optimal")
