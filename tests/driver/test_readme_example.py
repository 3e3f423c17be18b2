"""The README's "Write your own job" shows the bandit's driver as it is: every line of the
README's ``class Bandit`` block is a line of ``examples/bandit/job.py`` (comments aside), in the
same order, and the file has the code lines the README states."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
BANDIT = ROOT / "examples" / "bandit" / "job.py"
PROSE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def _code(line: str) -> str:
    return line.split("  # ")[0].rstrip()


def test_the_readme_loop_is_the_bandit_file_in_order() -> None:
    section = README[README.index("## Write your own job") :]
    block = section[section.index("```python") + len("```python") : section.index("\n```\n")]
    shown = [_code(line) for line in block.splitlines() if line.strip() and not line.startswith("result =")]
    source = [_code(line) for line in BANDIT.read_text(encoding="utf-8").splitlines()]
    position = 0
    for line in shown:
        assert line in source[position:], f"not in examples/bandit/job.py, in this order: {line!r}"
        position = source.index(line, position) + 1


def test_the_readme_states_the_bandit_code_lines() -> None:
    """Code lines as the project counts them: lines holding a token that is neither a comment nor
    part of a docstring."""
    text = BANDIT.read_text(encoding="utf-8")
    docstrings = {
        line
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    lines = {
        row
        for token in tokenize.generate_tokens(io.StringIO(text).readline)
        if token.type not in PROSE
        for row in range(token.start[0], token.end[0] + 1)
    }
    stated = re.search(r"REINFORCE\s+on a 4-armed bandit, (\d+) code lines", README)
    assert stated is not None and len(lines - docstrings) == int(stated.group(1))
