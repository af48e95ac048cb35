"""Our ``ib_acme -O`` file against the one Debian's real ib_acme writes."""

from __future__ import annotations

import subprocess
from pathlib import Path

from ibacm.config.option_file import parse_options
from ibacm.config.opts_template import render_opts_file
from tests.conftest import require_peer


def active_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip() and not line.startswith("#")]


def test_generated_option_file_matches_the_real_tool(tmp_path: Path) -> None:
    ib_acme = require_peer("ib_acme")
    ours_dir, real_dir = tmp_path / "ours", tmp_path / "real"
    ours_dir.mkdir()
    # ib_acme creates missing directories with mode 0644 (no search bit): give it one.
    real_dir.mkdir()
    result = subprocess.run(
        [ib_acme, "-O", "-D", str(real_dir)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    real_text = (real_dir / "ibacm_opts.cfg").read_text()
    (ours_dir / "ibacm_opts.cfg").write_text(render_opts_file())
    ours_text = (ours_dir / "ibacm_opts.cfg").read_text()

    real_options, real_issues = parse_options(real_text, "real")
    our_options, our_issues = parse_options(ours_text, "ours")
    assert real_issues == [] and our_issues == []
    assert our_options == real_options
    assert active_lines(ours_text) == active_lines(real_text)
