"""The one base of the package's exceptions, so that a caller can catch all of them at once."""

from __future__ import annotations


class AutoLoCoError(Exception):
    """Raised by autoloco_hf; each subclass also keeps the
    built-in base it had (ValueError, RuntimeError)."""


class ConfigError(AutoLoCoError, ValueError):
    """A configuration field has an invalid value; the message names the field and the fix."""


class AutoLoCoConfigurationError(AutoLoCoError, RuntimeError):
    """The Trainer or Accelerate launch is set up in a way AutoLoCo cannot run correctly.

    It sits here, not beside the launch checks, so that the Trainer's modules raise it without
    importing the checks (one floor fewer).
    """
