"""What the command-line tests share: a known error is one line on stderr and exit 2."""

from __future__ import annotations


def one_line_error(capsys, code) -> str:
    """The one line a known error prints (exit 2, no traceback)."""
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    return lines[0]
