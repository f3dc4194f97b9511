"""Research around tideflow: bounds, decompositions and replays that bench/ measures with.

Nothing under tideflow/ imports this package (an import-linter contract says so);
it imports tideflow. Its tests are under tests/research/, marked ``research``.
"""
