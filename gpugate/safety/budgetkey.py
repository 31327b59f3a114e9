"""The drain budget key: what proves that a finding published in a node's
Slurm Comment was written by gpugate on that node (gpugate.slurm.pending).

Slurm admins and operators may set any node's Comment, and users read it;
only root on the GPU nodes and on the controller(s) may read this key.  A
node signs what it publishes with it; the keeper (gpugate.keeper.run) drains a
published finding only when its proof verifies.  Like munge.key, one copy
on every node and controller, distributed by the site's configuration
management:

    (umask 077; head -c 32 /dev/urandom > /etc/gpugate/drain-budget.key)

The file must pass the trust walk (gpugate.safety.trust: root's, and every
directory above it) and be readable by root alone (mode 0600 or 0400):
whoever reads it can sign.  Missing or refused on the controller, the keeper
drains nothing published (it fails its run, saying why); on a node, the
finding is published unsigned, held and visible, never drained."""

import os
import stat

from gpugate.errors import GpugateError

DEFAULT = "/etc/gpugate/drain-budget.key"
_CAP = 4096
_MIN_BYTES = 16
WHAT = "the drain budget key"


class KeyUnavailable(GpugateError):
    """The key is missing, unreadable, or readable by others: nothing signed
    or verified with it."""


def path(settings) -> str:
    return str(settings.drain_budget.get("key_file") or DEFAULT)


def load(settings) -> bytes:
    """The key's bytes (surrounding whitespace removed, so a hex or base64
    text key works), or KeyUnavailable saying why and how to fix it."""
    from gpugate.safety import trust
    from gpugate.safety.safeio import read_fd

    where = path(settings)
    try:
        fd = trust.open_file(where, WHAT)
    except FileNotFoundError:
        raise KeyUnavailable("%s %s is missing: create it on every node and controller "
                             "((umask 077; head -c 32 /dev/urandom > %s), the same file everywhere)"
                             % (WHAT, where, where)) from None
    except (GpugateError, OSError) as exc:  # trust.Untrusted is a ConfigError
        raise KeyUnavailable("%s: %s" % (WHAT, exc)) from None
    try:
        mode = os.fstat(fd).st_mode
        if mode & 0o077:
            raise KeyUnavailable("%s %s is readable by group or others (mode %04o): whoever reads it can sign "
                                 "a published finding; chmod 600 %s and replace it everywhere"
                                 % (WHAT, where, stat.S_IMODE(mode), where))
        data = read_fd(fd, _CAP, where).strip()
    except OSError as exc:
        raise KeyUnavailable("%s %s: %s" % (WHAT, where, exc)) from None
    finally:
        os.close(fd)
    if len(data) < _MIN_BYTES:
        raise KeyUnavailable("%s %s holds %d bytes; at least %d are needed ((umask 077; head -c 32 /dev/urandom > %s))"
                             % (WHAT, where, len(data), _MIN_BYTES, where))
    return data
