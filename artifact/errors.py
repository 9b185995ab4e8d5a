"""Errors a user can fix: bad settings, files and arguments.

`python -m artifact` prints these as one line and exits 2; anything else is a bug and shows its
traceback. Each is a ValueError, so code that guards with `except ValueError` keeps working.
Raise the most specific class, with a message that names the file, key or value and what is expected.
"""

from __future__ import annotations


class UserError(ValueError):
    """A bad input, named in the message; not a bug in the artifact."""


class SettingError(UserError):
    """A setting out of range or of the wrong kind: a CLI flag, a RunSpec field, a link knob."""


class SpecError(SettingError):
    """A RunSpec field out of its domain (artifact/offload/spec.py); `field` names it, so the profile reader
    and the command line can name the key or the flag the value came from."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


class ProfileError(SettingError):
    """A profile file or a --set override: unknown key, wrong type, out of range, given twice."""


class TraceError(UserError):
    """A routing trace that cannot be read, or is of another model or run."""


class CheckpointError(UserError):
    """A checkpoint directory that is not a readable LLaDA2-MoE checkpoint."""


class ResultFileError(UserError):
    """A result file (bench CSV) that is damaged, of other settings, or would be overwritten."""


class RunsError(ResultFileError):
    """A stored run (data/results/<profile>/runs/run<k>/) that is damaged, missing or of another commit, or
    too few stored runs for what is asked."""


class DeviceError(UserError):
    """A device or link that this machine does not have (e.g. --device cuda without a GPU)."""
