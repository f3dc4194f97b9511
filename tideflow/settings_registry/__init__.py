"""The one registry of ``TIDEFLOW_*`` settings: every read of one goes through it.

``SETTINGS`` declares each variable once (``Setting``: name, kind, bounds or words,
the default per backend, who reads it, one line of help); the accessors read
``os.environ`` (or a given mapping) and check the value against its declaration,
raising ``ConfigError`` that names the variable, the value and what is accepted.
It sits below every other package so that each may import it.
"""

from tideflow.settings_registry.access import (
    check_set,
    declared,
    env_number,
    flag,
    number,
    optional_number,
    optional_path,
    optional_text,
    optional_whole,
    raw,
    text,
    whole,
)
from tideflow.settings_registry.declared import BY_NAME, SETTINGS
from tideflow.settings_registry.model import (
    BACKENDS,
    READERS,
    STORE_SCHEMES,
    ConfigError,
    Reader,
    Setting,
    bad_setting,
)

__all__ = [
    "BACKENDS",
    "BY_NAME",
    "READERS",
    "SETTINGS",
    "STORE_SCHEMES",
    "ConfigError",
    "Reader",
    "Setting",
    "bad_setting",
    "check_set",
    "declared",
    "env_number",
    "flag",
    "number",
    "optional_number",
    "optional_path",
    "optional_text",
    "optional_whole",
    "raw",
    "text",
    "whole",
]
