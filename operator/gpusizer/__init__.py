"""gpusizer: autoscale and right-size GPU inference workloads from measured telemetry."""

__version__ = "0.1.0"
