"""tideflow: declarative ML training pipelines on shared GPU clusters."""

__version__ = "0.1.0"
