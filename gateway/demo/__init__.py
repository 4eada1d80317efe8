"""The reference upstream: a faithful, fast implementation of the Financial Records
Read API over a deterministic generated dataset, for the demo mode, tests and
benchmarks; with a drift, a candidate twin that differs from it in known ways, for
testing upstream comparisons; with change rates, records that change at random at
known rates, for testing what the gateway learns of how often answers change.

Imports nothing of the rest of ``gateway`` (an import-linter contract holds it), and
of third parties only aiohttp's server and orjson: it stands for an upstream another
team runs.
"""

from gateway.demo.app import (
    CHANGE_RATES,
    DATASET,
    DRIFT,
    RECORD_STORE,
    REQUEST_LOG,
    create_demo_app,
)
from gateway.demo.changes import ChangeRates, RecordKind
from gateway.demo.dataset import Dataset, generate_dataset
from gateway.demo.drift import Drift, DriftKind
from gateway.demo.request_log import RequestLog, RequestRecord
from gateway.demo.server import CannotListen, DemoServer, run_demo_upstream, start_demo_server

__all__ = [
    "CHANGE_RATES",
    "DATASET",
    "DRIFT",
    "RECORD_STORE",
    "REQUEST_LOG",
    "CannotListen",
    "ChangeRates",
    "Dataset",
    "DemoServer",
    "Drift",
    "DriftKind",
    "RecordKind",
    "RequestLog",
    "RequestRecord",
    "create_demo_app",
    "generate_dataset",
    "run_demo_upstream",
    "start_demo_server",
]
