"""One validator for every number a user gives: CLI flags, profile keys, RunSpec fields, link knobs; and
the YAML reader of what a user writes (profiles, --set values), which refuses a key given twice.

NaN and inf fail every check here (`v <= 0` is False for NaN, so a plain range test lets it through).
Each error is a SettingError (a ValueError the CLI prints as one line) naming the setting, the value
and what is expected.
"""

from __future__ import annotations

import math

import yaml

from artifact.errors import ProfileError, SettingError


def check_number(
    name: str,
    value,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    integer: bool = False,
    allow_none: bool = False,
):
    """`value` as float (or int when integer=True) if finite and within [low, high] (open ends with
    low_open / high_open), else a SettingError naming `name`. None passes only with allow_none."""
    if value is None:
        if allow_none:
            return None
        raise SettingError(f"{name} is required, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SettingError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    if integer and (not isinstance(value, int) and not float(value).is_integer()):
        raise SettingError(f"{name} must be an integer, got {value!r}")
    if not isinstance(value, int) and not math.isfinite(value):  # an int is finite (and may not fit a float)
        raise SettingError(f"{name} must be a finite number, got {value!r}")
    lo_bad = low is not None and (value <= low if low_open else value < low)
    hi_bad = high is not None and (value >= high if high_open else value > high)
    if lo_bad or hi_bad:
        lo = "" if low is None else ("(" if low_open else "[") + f"{low:g}"
        hi = "" if high is None else f"{high:g}" + (")" if high_open else "]")
        want = (
            f"in {lo}, {hi}"
            if low is not None and high is not None
            else f"{'>' if low_open else '>='} {low:g}"
            if low is not None
            else f"{'<' if high_open else '<='} {high:g}"
        )
        raise SettingError(f"{name} must be {want}, got {value!r}")
    return int(value) if integer else float(value)


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a mapping with a key given twice (plain YAML keeps the last one silently)."""

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise ProfileError(
                    f"{node.start_mark.name}: key {key!r} given twice (lines {seen[key]} and "
                    f"{key_node.start_mark.line + 1}); keep one"
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def load_yaml(text: str, name: str):
    """The YAML value of `text`, read by `name` (a file, or "--set KEY"): its marks and errors name it."""
    loader = _UniqueKeyLoader(text)
    loader.name = name  # marks (and so the errors) name the file, not "<unicode string>"
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
