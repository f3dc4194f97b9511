"""Training code written as teams write it, not for tideflow; tideflow must run it unchanged."""
