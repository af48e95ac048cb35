"""IB ACM: InfiniBand Communication Management Assistant, reimplemented on trio."""

__version__ = "0.1.0"
