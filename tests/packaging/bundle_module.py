"""packaging/bundle.py, loaded as a module (it is a script, not part of the ibacm package)."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

from tests.conftest import REPO

BUNDLE_PY = REPO / "packaging" / "bundle.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ibacm_packaging_bundle", BUNDLE_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses need the module registered
    spec.loader.exec_module(module)
    return module


bundle = _load()
