"""Airflow plugin of tideflow (imported as ``tideflow.plugins``)."""
