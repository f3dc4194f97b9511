"""The teams' scheduling replayed over synthetic months (``bench/teams.py``)."""
