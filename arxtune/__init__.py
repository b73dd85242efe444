"""arxtune: measure collective backends, calibrate crossovers, dispatch per call."""

__version__ = "0.1.0"
