"""A pytest plugin (``-p agentrecipe.envs.swe.pytest_report``) that writes each test's outcome as JSON.

``--swe-report PATH``: {"tests": {nodeid: {"passed": bool, "skipped": bool, "message": str}}} where a
test passes when its setup, call and teardown all pass; a skip (or xfail) is not a pass, so an edit
that makes a failing test skip itself does not fix it;
``message`` is the one-line crash message of the first failing phase
(e.g. ``AssertionError: assert 'Foo' == 'foo'``).
``--swe-trace F1,F2,...`` (files relative to the root) also records which tests executed
each line of those files: {"lines": {file: {line: [test index]}}, "order": [nodeid...]}
(a line tracer set per test; used once per package at build time).
"""

from __future__ import annotations

import json
import os
import sys
import threading

import pytest


def pytest_addoption(parser) -> None:
    parser.addoption("--swe-report", default=None)
    parser.addoption("--swe-trace", default=None, help="comma-separated files")


class _Recorder:
    def __init__(self, path: str, trace: list[str] | None) -> None:
        self.path = path
        self.tests: dict[str, dict] = {}
        self.order: list[str] = []
        self.trace = {os.path.abspath(f): f for f in trace} if trace is not None else None
        self.lines: dict[str, dict[int, set[int]]] = {}
        self.current = -1

    # Tracing: only frames of the traced files get a local tracer.
    def _global(self, frame, event, arg):
        name = self.trace.get(frame.f_code.co_filename)
        if name is None:
            return None
        lines = self.lines.setdefault(name, {})
        index = self.current

        def local(frame, event, arg):
            if event == "line":
                lines.setdefault(frame.f_lineno, set()).add(index)
            return local

        return local

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        self.order.append(item.nodeid)
        self.current = len(self.order) - 1
        if self.trace is not None:
            sys.settrace(self._global)
            threading.settrace(self._global)
        yield
        if self.trace is not None:
            sys.settrace(None)
            threading.settrace(None)

    def pytest_runtest_logreport(self, report) -> None:
        entry = self.tests.setdefault(report.nodeid, {"passed": True, "skipped": False, "message": ""})
        if report.skipped and entry["passed"]:
            entry.update(passed=False, skipped=True, message="skipped")
        elif report.failed and (entry["passed"] or entry["skipped"]):
            entry.update(passed=False, skipped=False)
            crash = getattr(report.longrepr, "reprcrash", None)
            text = crash.message if crash is not None else str(report.longrepr)
            entry["message"] = (f"[{report.when}] " if report.when != "call" else "") + text.strip()[:500]

    def pytest_sessionfinish(self, session) -> None:
        out: dict = {"tests": self.tests}
        if self.trace is not None:
            out["order"] = self.order
            out["lines"] = {f: {str(n): sorted(ix) for n, ix in ls.items()} for f, ls in self.lines.items()}
        with open(self.path, "w") as f:
            json.dump(out, f)


def pytest_configure(config) -> None:
    path = config.getoption("--swe-report")
    if path:
        config.pluginmanager.register(_Recorder(path, _split(config.getoption("--swe-trace"))), "swe-recorder")


def _split(value: str | None) -> list[str] | None:
    return None if value is None else [f for f in value.split(",") if f]
