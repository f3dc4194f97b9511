"""S3 upload throughput of the checkpoint store versus raw boto3, on the same server and bytes.

    .venv/bin/python bench/s3_throughput.py [--size-mb 256] [--repeat 3]

Starts a SeaweedFS server on 127.0.0.1 (the one the local stack uses), uploads
one file through ``CheckpointManager.write_shard`` (streaming SHA-256, then
boto3's transfer manager) and through boto3's ``upload_file`` with the same
TransferConfig, alternating, and reports MB/s and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tideflow.checkpoint import CheckpointManager
from tideflow.stack.processes import stop_group
from tideflow.stack.services import StackState, start_s3

TARGET = 0.90


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tideflow-bench-") as scratch:
        state = StackState(str(Path(scratch) / "stack"))
        service = start_s3(state)
        try:
            state.services["s3"] = service
            os.environ.update({**state.client_env(), "AWS_ENDPOINT_URL_S3": service.url})
            import boto3
            from boto3.s3.transfer import TransferConfig

            payload = Path(scratch) / "payload.bin"
            with open(payload, "wb") as handle:
                for _ in range(args.size_mb):
                    handle.write(os.urandom(1024 * 1024))
            manager = CheckpointManager("s3://tideflow/bench/store")
            client = boto3.client("s3")
            config = TransferConfig(
                multipart_threshold=64 * 1024 * 1024,
                multipart_chunksize=64 * 1024 * 1024,
                max_concurrency=8,
            )
            store_times, raw_times = [], []
            for attempt in range(args.repeat):
                started = time.perf_counter()
                client.upload_file(str(payload), "tideflow", f"bench/raw/{attempt}", Config=config)
                raw_times.append(time.perf_counter() - started)
                started = time.perf_counter()
                manager.write_shard(attempt, "payload.bin", payload)
                store_times.append(time.perf_counter() - started)
        finally:
            stop_group(service.pid)
    store = args.size_mb / statistics.median(store_times)
    raw = args.size_mb / statistics.median(raw_times)
    result = {
        "size_mb": args.size_mb,
        "store_mb_s": round(store, 1),
        "raw_boto3_mb_s": round(raw, 1),
        "ratio": round(store / raw, 3),
        "target_met": store / raw >= TARGET,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"{args.size_mb} MB file, median of {args.repeat} uploads each")
        print(f"  tideflow store (hash + upload)  {store:.1f} MB/s")
        print(f"  raw boto3 upload_file           {raw:.1f} MB/s")
        print(
            f"  ratio                           {store / raw:.1%} (target >= {TARGET:.0%}: "
            f"{'met' if result['target_met'] else 'MISSED'})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
