"""Object stores addressed by URI (``file://``, ``s3://``) with validated keys."""

from tideflow.storage.keys import UnsafeKeyError, check_key, safe_segment, unique_segment
from tideflow.storage.store import FileStore, S3Store, Store, open_store

__all__ = [
    "FileStore",
    "S3Store",
    "Store",
    "UnsafeKeyError",
    "check_key",
    "open_store",
    "safe_segment",
    "unique_segment",
]
