"""IB ACM: InfiniBand Communication Management Assistant, reimplemented on trio."""

from ibacm.compiled import activate as _activate

__version__ = "0.1.0"

variant = _activate()
"""Which variant of the hot modules this process runs (see ``ibacm.compiled``)."""
