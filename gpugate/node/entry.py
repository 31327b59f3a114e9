"""What slurmd runs: HealthCheckProgram, Prolog and Epilog.

slurmd gives these an empty environment (no PATH, no SLURM_CONF) and only
logs the health check's exit code, so each entry point finds its
configuration by absolute path, acts on the verdict itself, leaves one
structured log line, and never lets a traceback reach slurmd.
"""

import os
import sys
import time

from gpugate.errors import ConfigError, GpugateError

USAGE = """usage: gpugate-{mode} [--config PATH]

Slurm {what} of gpugate.  Reads PATH (default $GPUGATE_CONFIG or
/etc/gpugate/gpugate.toml).  Exit codes: 0 fit, 1 unfit (drained),
2 configuration or internal error (nothing changed; the prolog and epilog
exit 0 instead, so that slurmd does not drain the node for gpugate's own
failure, and log the error)."""
_WHAT = {"healthcheck": "HealthCheckProgram", "prolog": "Prolog", "epilog": "Epilog"}


def main(mode, argv, reader=None):
    """reader: the prolog's NVML reader, when its entry script forked it
    already (gpugate.node.prolog_reader)."""
    started = time.monotonic()
    # slurmd's umask is not ours to trust: nothing gpugate creates is
    # writable, or readable, by others unless it says so (a textfile 0644).
    os.umask(0o077)
    config = None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("-h", "--help"):
            print(USAGE.format(mode=mode, what=_WHAT[mode]))
            return 0
        if arg in ("-c", "--config") and args:
            config = args.pop(0)
        elif arg.startswith("--config="):
            config = arg.split("=", 1)[1]
        else:
            sys.stderr.write("gpugate-%s: unknown argument %r\n%s\n" % (mode, arg, USAGE.format(mode=mode, what=_WHAT[mode])))
            return 2
    # slurmd names its node; a Kubernetes DaemonSet passes the Node's name (spec.nodeName).
    node = os.environ.get("SLURMD_NODENAME") or os.environ.get("GPUGATE_NODE_NAME") or _hostname()
    record = {"node": node, "mode": mode}
    settings = None
    if mode == "prolog" and reader is None:
        from gpugate.node.prolog_reader import start_reader

        reader = start_reader()  # loads NVML's binding while the configuration loads
    try:
        from gpugate.model.config import check_state, config_path
        from gpugate.core.names import check_node_name
        from gpugate.node.lastgood import load_settings

        check_node_name(node, "SLURMD_NODENAME")
        # A file that does not load: the last good copy, and the error logged.
        settings = load_settings(config_path(config), node, record)
        check_state(settings.state_dir(node))
        if mode == "healthcheck":
            from gpugate.node.healthcheck import run
        elif mode == "prolog":
            from gpugate.node.prolog import run
        else:
            from gpugate.node.epilog import run
        if settings.sim_fleet:  # a simulated node: this run reads one generation of its files, whole
            from gpugate.model import simview

            simview.pin(settings.sim_fleet, node)
        code = run(settings, node, record, reader) if reader else run(settings, node, record)
    except ConfigError as exc:
        # Bad configuration with no last good copy changes nothing: no
        # drain, no resume, a loud log.
        record.update(verdict="error", error=str(exc)[:500], config_error=str(exc)[:500])
        code = 2
    except GpugateError as exc:
        record.update(verdict="error", error=str(exc)[:500])
        code = 2
    except Exception as exc:  # never a traceback into slurmd's log
        record.update(verdict="error", error="internal error: %s: %s" % (type(exc).__name__, exc))
        code = 2
    if settings is not None and settings.sim_fleet:
        from gpugate.model import simview

        simview.unpin(settings.sim_fleet, node)
    if reader is not None:
        reader.cancel()  # after an error: it leaves, or is killed; after its answer: nothing to do
    record["duration"] = round(time.monotonic() - started, 4)
    if record.get("verdict") == "error" and mode != "healthcheck":
        # A non-zero prolog/epilog makes slurmd drain the node with an
        # untagged "Prolog error": a bad baseline push would drain the whole
        # fleet.  Our own failure is logged loudly and lets the job run.
        record["exit"] = "0 (gpugate could not judge: job not blocked)"
        code = 0
    record.setdefault("exit", code)
    _log(settings, node, record)
    if record.get("verdict") == "error":
        sys.stderr.write("gpugate-%s: %s\n" % (mode, record.get("error")))
    elif record.get("config_error"):
        sys.stderr.write("gpugate-%s: %s\n" % (mode, record["config_error"]))
    return code


def leave(code: int) -> None:
    """Exit without the interpreter's teardown (freeing every module loaded:
    about 1.5 ms of every job's prolog).  Everything gpugate writes is closed
    by then (state files, the log line); the forked NVML reader has answered
    (and is reaped here) or been killed; a tool still running at the
    deadline is killed with its process group; no atexit handler is
    registered on these paths."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # slurmd closed the pipe: nothing to say there anyway
    forked = sys.modules.get("gpugate.safety.forked")
    if forked is not None:
        forked.finish()  # the NVML reader that answered: exiting meanwhile, reaped here
    runner = sys.modules.get("gpugate.safety.runner")
    if runner is not None:
        runner.stop_running()  # a tool still hanging at the deadline: not left behind
    os._exit(code)


def _log(settings, node, record):
    from gpugate.node.logline import emit

    if settings is None:  # no readable configuration, so no state directory: syslog only
        emit("syslog", "", record)
        return
    emit(settings.log, settings.state_dir(node), record)


def _hostname():
    import socket

    return socket.gethostname().split(".")[0]

