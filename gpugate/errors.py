"""Typed errors.  The CLI maps them to messages and exit codes in one place."""


class GpugateError(Exception):
    """Base class; ``str(err)`` is a message an admin can act on."""

    exit_code = 2
    # A wait that polls (the sweep's) may ask the same again later: the other
    # side did not answer this time.  Each scheduler's error says so itself.
    ask_again = False


class ConfigError(GpugateError):
    """gpugate.toml or baseline.toml is missing, unreadable or invalid."""


class ParseError(GpugateError):
    """A tool printed something we cannot read."""


class CommandError(GpugateError):
    """An external command failed, timed out or is missing."""

    def __init__(self, argv, message, rc=None, stdout="", stderr="", timed_out=False, missing=False,
                 refused=False, overflow=False):
        self.argv = list(argv)
        self.rc = rc
        self.stdout = stdout
        self.stderr = stderr
        self.timed_out = timed_out
        self.missing = missing
        self.refused = refused  # not root's alone (gpugate.safety.trust): nothing ran
        self.overflow = overflow  # printed more than its cap (gpugate.safety.runner): killed
        super().__init__(message)


class MirrorError(GpugateError):
    """The scheduler's write landed; its mirror on the other side (Slurm on
    Kubernetes: the Node) did not.  The next read of the node puts it right."""


class SlurmError(GpugateError):
    """Slurm refused or did not answer."""

    exit_code = 3
    # Slurm's clients say "did not answer" many ways, and the commands
    # backend has already tried a dropped read twice: a wait reads again.
    ask_again = True
