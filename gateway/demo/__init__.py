"""The reference upstream: a faithful, fast implementation of the Financial Records
Read API over a deterministic generated dataset, for the demo mode, tests and
benchmarks; with a drift, a candidate twin that differs from it in known ways, for
testing upstream comparisons. It shares no code with the rest of ``gateway``.
"""

from gateway.demo.app import DATASET, DRIFT, RECORD_STORE, REQUEST_LOG, create_demo_app
from gateway.demo.dataset import Dataset, generate_dataset
from gateway.demo.drift import Drift, DriftKind
from gateway.demo.request_log import RequestLog, RequestRecord
from gateway.demo.server import DemoServer, run_demo_upstream, start_demo_server

__all__ = [
    "DATASET",
    "DRIFT",
    "RECORD_STORE",
    "REQUEST_LOG",
    "Dataset",
    "DemoServer",
    "Drift",
    "DriftKind",
    "RequestLog",
    "RequestRecord",
    "create_demo_app",
    "generate_dataset",
    "run_demo_upstream",
    "start_demo_server",
]
