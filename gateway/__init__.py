"""records-gateway: a caching, normalising gateway for the Financial Records Read API."""

__version__ = "0.1.0"
