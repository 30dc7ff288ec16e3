"""The Disbatch plugin SDK for Python.

A Disbatch plugin is a WebAssembly component implementing the ``plugin`` world of the
repository's ``wit/plugin.wit``. ``componentize-py`` builds one from a Python module
(``plugins/build-py-js`` installs it and builds). With this module a plugin is one
decorated function in that module (``app.py``)::

    from dataclasses import dataclass

    from disbatch_plugin import SUCCEEDED, plugin, progress


    @dataclass
    class Params:
        name: str
        times: int = 1


    @plugin
    def run(params: Params) -> int:
        progress(50, "greeting")
        for _ in range(params.times):
            print(f"hello, {params.name}")
        return SUCCEEDED

The contract:

- The function takes one argument, the task's params. Annotated with a dataclass, the
  params are checked before the function runs: a missing field, an unknown field or a
  value of the wrong type fails the task with ``invalid params: …`` naming the field.
  Annotated with ``dict``, ``Any`` or nothing, it gets the parsed JSON as it is.
- It returns the task's status: an ``int`` from 1 to 4294967295 (``SUCCEEDED``,
  ``FAILED`` or a larger value of your own). Anything else (``None``, a ``bool``, a
  negative number, a ``str``…) fails the task with ``invalid status …``. ``0`` is passed
  on to the host, which rejects it and fails the task.
- ``raise TaskError(message)`` fails the task with ``message`` added to its stderr. Any
  other exception fails it with ``<exception type>: <message>``, its traceback printed to
  stderr first.
- ``print()`` and ``sys.stderr`` are the task's stdout and stderr.
- ``progress(percent, info)`` reports progress.
- ``submit(queue, params)`` submits a follow-up task to a queue the task's queue grants
  in its ``sandbox.submit``; it is created only if the task succeeds. A refused call
  raises ``SubmitError`` (a ``TaskError``) with the host's reason.

Outside a component (plain CPython, e.g. in your own unit tests) the decorated function
is an ordinary function and ``progress`` and ``submit`` print to stderr.
"""

import dataclasses
import json
import sys
import traceback
import types
import typing

try:
    import wit_world as _wit_world
    from wit_world.imports import host as _host
except ImportError:  # plain CPython: not inside a component
    _wit_world = None
    _host = None

__all__ = [
    "FAILED",
    "MAX_STATUS",
    "SUCCEEDED",
    "ParamsError",
    "SubmitError",
    "TaskError",
    "parse_params",
    "plugin",
    "progress",
    "submit",
]

SUCCEEDED = 1
"""Status of a task that succeeded."""
FAILED = 2
"""Status of a task that failed."""
MAX_STATUS = 4294967295
"""The largest status a task can have (a WIT ``u32``)."""


class TaskError(Exception):
    """Raise it to fail the task with its message added to the task's stderr."""


class SubmitError(TaskError):
    """The host refused a ``submit`` call; the message says why."""


class ParamsError(ValueError):
    """The task's params do not fit the plugin's params type."""


def progress(percent=None, info=None):
    """Reports progress: ``percent`` (0 to 100) and/or a short message ``info``.

    Either may be omitted. The host clamps the percentage, ignores NaN, keeps at most
    1 KiB of ``info`` and only the latest reports, so calling this often is fine.
    """
    percent = None if percent is None else float(percent)
    info = None if info is None else str(info)
    if _host is not None:
        _host.progress(percent, info)
    else:
        shown = " ".join(s for s in (None if percent is None else f"{percent:.1f}%", info) if s)
        print(f"progress {shown}", file=sys.stderr)


def submit(queue, params):
    """Submits a follow-up task of ``queue`` (its name or id) with ``params``, a ``dict``
    (or its JSON text).

    The host records it and creates it only if this task succeeds (status 1), keyed
    ``submit:<task id>:<n>`` and running after this task. Raises ``SubmitError`` with the
    host's reason when the call is refused: the queue is not in the task's
    ``sandbox.submit``, a bound was reached (``sandbox.submit_max`` follow-ups per task,
    1 MiB of params each, 16 MiB per task) or the params are not an object. A refused call
    submits nothing; uncaught, it fails the task with that reason.
    """
    text = params if isinstance(params, str) else json.dumps(params)
    if _host is None:
        print(f"submit {queue} {text}", file=sys.stderr)
        return
    try:
        _host.submit(str(queue), text)
    except Exception as e:  # componentize-py raises Err(value) for an err result
        reason = getattr(e, "value", None)
        if isinstance(reason, str):
            raise SubmitError(reason) from None
        raise


def parse_params(params_type, text):
    """Parses the JSON ``text`` into ``params_type`` (a dataclass, ``dict``, ``Any``…).

    Raises ``ParamsError`` naming the field when the params do not fit.
    """
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ParamsError(f"not valid JSON: {e}") from None
    return _convert(value, params_type, None)


def plugin(func):
    """Exports ``func`` as the plugin's ``run``; use it once, in the module that is built.

    ``func`` takes the task's params (see the module's documentation) and returns a
    status. It is returned unchanged, so it can still be called directly in tests.
    """
    module = sys.modules[func.__module__]
    if hasattr(module, "WitWorld"):
        raise TypeError(f"@plugin is used more than once in module {module.__name__}")
    params_type = _params_type(func)

    class WitWorld(_wit_world.WitWorld if _wit_world is not None else object):
        def run(self, params: str) -> int:
            return _run(func, params_type, params)

    module.WitWorld = WitWorld
    return func


def _params_type(func):
    import inspect

    parameters = list(inspect.signature(func).parameters.values())
    if len(parameters) != 1 or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise TypeError(f"@plugin: {func.__name__} must take exactly one argument, the task's params")
    hints = typing.get_type_hints(func)
    return hints.get(parameters[0].name, typing.Any)


def _run(func, params_type, text):
    """Runs one task: returns its status, or raises ``Err`` with the message it fails with."""
    from componentize_py_types import Err

    try:
        message = None
        try:
            params = parse_params(params_type, text)
        except ParamsError as e:
            raise Err(f"invalid params: {e}") from None
        try:
            status = func(params)
        except Err:
            raise
        except TaskError as e:
            message = str(e) or "the task failed"
        except SystemExit as e:
            message = f"sys.exit({e.code!r}) was called: return a status from the plugin function instead"
        except BaseException as e:
            # The traceback from the plugin's function down, without this module's frame.
            traceback.print_exception(type(e), e, e.__traceback__.tb_next if e.__traceback__ else None)
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        if message is not None:
            raise Err(message)
        problem = _status_problem(status)
        if problem is not None:
            raise Err(problem)
        return status
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass


def _status_problem(status):
    """Why ``status`` cannot be returned, or ``None``."""
    if isinstance(status, int) and not isinstance(status, bool) and 0 <= status <= MAX_STATUS:
        return None
    if isinstance(status, int) and not isinstance(status, bool):
        shown = str(int(status))
    elif status is None:
        shown = "None (nothing was returned)"
    else:
        shown = f"{status!r} ({type(status).__name__})"
    return (
        f"invalid status {shown}: the plugin function must return an int from 1 to {MAX_STATUS} "
        "(SUCCEEDED, FAILED or your own)"
    )


_NONE = type(None)


def _where(path):
    return f'field "{path}": ' if path else ""


def _describe(value):
    """A JSON value as an error message shows it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {'true' if value else 'false'}"
    if isinstance(value, (int, float)):
        return f"number {json.dumps(value)}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:40] + "…"
        return f"string {json.dumps(shown)}"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _expected(tp):
    """What a type expects, as an error message says it."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_expected(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return " or ".join(json.dumps(a) for a in typing.get_args(tp))
    names = {
        str: "a string",
        int: "an integer",
        float: "a number",
        bool: "true or false",
        _NONE: "null",
        None: "null",
        list: "an array",
        dict: "an object",
    }
    if origin is not None and origin in names:
        return names[origin]
    if tp in names:
        return names[tp]
    if dataclasses.is_dataclass(tp):
        return "an object"
    return getattr(tp, "__name__", str(tp))


def _convert(value, tp, path):
    """``value`` (parsed JSON) checked against ``tp``; raises ``ParamsError``."""

    def wrong():
        return ParamsError(f"{_where(path)}expected {_expected(tp)}, got {_describe(value)}")

    if tp is typing.Any or tp is object:
        return value
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and _NONE in args:
            return None
        others = [a for a in args if a is not _NONE]
        if len(others) == 1:  # Optional[X]: X's own error names the inner field
            return _convert(value, others[0], path)
        for arg in args:
            if arg is _NONE:
                continue
            try:
                return _convert(value, arg, path)
            except ParamsError:
                pass
        raise wrong()
    if origin is typing.Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
        raise wrong()
    if tp is _NONE or tp is None:
        if value is None:
            return None
        raise wrong()
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise wrong()
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise wrong()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise wrong()
    if tp is str:
        if isinstance(value, str):
            return value
        raise wrong()
    if tp is list or origin is list:
        if not isinstance(value, list):
            raise wrong()
        if not args:
            return value
        return [_convert(v, args[0], f"{path or ''}[{i}]") for i, v in enumerate(value)]
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise wrong()
        if len(args) != 2:
            return value
        return {k: _convert(v, args[1], f"{path}.{k}" if path else k) for k, v in value.items()}
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        if not isinstance(value, dict):
            raise wrong()
        return _dataclass(value, tp, path)
    return value


def _dataclass(value, cls, path):
    hints = typing.get_type_hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init]
    names = [f.name for f in fields]
    for key in value:
        if key not in names:
            full = f"{path}.{key}" if path else key
            raise ParamsError(f'unknown field "{full}" (the fields are: {", ".join(names)})')
    kwargs = {}
    for f in fields:
        full = f"{path}.{f.name}" if path else f.name
        if f.name in value:
            kwargs[f.name] = _convert(value[f.name], hints.get(f.name, typing.Any), full)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ParamsError(f'missing field "{full}"')
    return cls(**kwargs)
