"""Exceptions a user can act on. Each message says what went wrong, where, and how to fix it."""


class AnchoredReasoningError(Exception):
    """Base class for every error this library raises on purpose."""


class DataError(AnchoredReasoningError):
    """A data file or row is missing or malformed (the message names the file and line)."""


class ConfigError(AnchoredReasoningError):
    """A task spec, recipe, suite or command-line option is invalid (the message names the key)."""


class BackendError(AnchoredReasoningError):
    """A generation backend failed (server down after retries, missing optional extra, ...)."""


class ResumeError(AnchoredReasoningError):
    """An output directory holds a run whose settings differ from the ones asked for."""


class UnisolatedCodeError(ConfigError):
    """Model-written code would run without isolation (no namespaces, or as root with no way to drop to an
    unprivileged uid); the code sandbox refuses unless the user opts in (see docs/sandbox.md)."""
