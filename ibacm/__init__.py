"""IB ACM: InfiniBand Communication Management Assistant, reimplemented on trio."""

import sys

from ibacm.compiled import activate as _activate

__version__ = "0.1.0"

# ``variant``: which variant of the hot modules this process runs (see ``ibacm.compiled``).
# A bad IBACM_COMPILED stops every ibacm command with one line, not a traceback.
try:
    variant = _activate()
except ImportError as exc:
    raise SystemExit(f"ibacm: {exc}") from None


def _import_structlog_without_rich() -> None:
    """Import structlog as ibacm uses it: without ``rich``.

    ``structlog.dev`` imports rich whenever it is installed (Textual needs it), only to draw
    tracebacks in colour; ibacm renders JSON or plain console lines. rich and pygments are 4.5
    MB of every daemon's idle RSS and 70 ms of its start. rich is hidden for structlog's import
    only: structlog then formats tracebacks as plain text, and anything imported later (the
    dashboard, a provider) imports rich as usual.
    """
    if "structlog" in sys.modules or "rich" in sys.modules:
        return  # too late, or rich is in use already: structlog may use it
    sys.modules["rich"] = None  # type: ignore[assignment]  # `import rich` raises ImportError
    try:
        import structlog  # noqa: F401
    finally:
        del sys.modules["rich"]


_import_structlog_without_rich()
