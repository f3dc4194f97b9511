"""The Airflow layer that turns compiled plans into DAGs (imports Airflow)."""
