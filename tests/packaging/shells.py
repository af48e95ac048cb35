"""Completion as the shells do it: a real bash calling the function ``complete -p`` names, a
real interactive zsh on a pseudo-terminal pressing <Tab>. Used by test_completion (the scripts
of the source tree) and test_deb (the files the package installs)."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from tests.conftest import require_peer

# Runs $1 (which loads the completion of a command), finds the function `complete -p` registered
# for the command and calls it as bash does on <Tab>: COMP_WORDS/COMP_CWORD set, the command,
# the word being completed and the one before as arguments. Prints `complete -p`, then one
# match a line.
DRIVER = r"""
eval "$1"; shift
spec=$(complete -p "$1") || exit 3
printf '%s\n' "$spec"
function=$(sed -n 's/.* -F \([^ ]*\) .*/\1/p' <<<"$spec")
COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 ))
COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}; COMP_TYPE=9; COMP_KEY=9
"$function" "$1" "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}"
printf '%s\n' "${COMPREPLY[@]}"
"""

# An interactive zsh on a pseudo-terminal (zpty) with the scripts on $fpath and compinit, where
# the line is typed and completed with <Tab>. compadd is wrapped to print what the completion
# system adds (then adds it), as the matches are otherwise only drawn on the terminal.
ZSH_DRIVER = r"""
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z "fpath=(${(q)1} \$fpath); autoload -U compinit; compinit -u -D"
zpty -w z 'compadd() { local -a hits; builtin compadd -O hits "$@"; \
  (( $#hits )) && print -rl -- "" "<m>"${^hits}; builtin compadd "$@"; }'
zpty -w z "PROMPT='> '; bindkey '^I' complete-word; print '<ready>'"
zpty -r z line '*<ready>*'
zpty -w -n z "$2"$'\t'$'\C-u'
zpty -w z "print '<end>'"
out=
while zpty -r z chunk; do out+=$chunk; [[ $out == *'<end>'*'<end>'* ]] && break; done
zpty -d z
print -r -- "${out//$'\r'/}" | grep -o '<m>[^[:cntrl:]]*' | sed 's/^<m>//' | sort -u
"""


def zsh_complete(directory: Path, line: str) -> list[str]:
    """The matches zsh offers when <Tab> is pressed at the end of ``line``."""
    zsh = require_peer("zsh")
    done = subprocess.run(
        [zsh, "-f", "-c", ZSH_DRIVER, "driver", str(directory), line],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/"), "TERM": "dumb"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split()


def bash_complete(script: Path | str, *words: str) -> tuple[str, list[str]]:
    """(``complete -p`` of the command, the matches) for a command line whose last word is
    being completed. ``script``: the completion file to source, or shell code that loads it."""
    load = f"source {shlex.quote(str(script))}" if isinstance(script, Path) else script
    bash = require_peer("bash")
    done = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", DRIVER, "driver", load, *words],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/")},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "", done.stderr
    spec, *matches = done.stdout.splitlines()
    return spec, [m for m in matches if m]
