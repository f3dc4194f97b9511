"""Entry points of the example pipelines in ``pipelines/``."""
