"""The local stack: an S3-compatible server, MLflow and Airflow on 127.0.0.1.

Started and stopped by ``python -m tideflow.stack`` (``make demo``/``make down``)
and by the tests that need real servers. Nothing here imports Airflow or
MLflow: their command-line programs are started as processes.
"""
