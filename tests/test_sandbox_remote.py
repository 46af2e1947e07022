"""The python tool's remote sandbox (mindgrpo/tools/remote.py) against a stub SandboxFusion server on 127.0.0.1 that
each test starts and stops: the request carries SandboxFusion's fields as verl sends them, the answer reads back as
the local sandboxes' does, and every failure of the service is the tool's answer, never the run's end."""
import json
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mindgrpo.config import ConfigError, GRPOConfig, validate
from mindgrpo.tools import SandboxLimits, ToolCall, ToolRunner, resolve_tools, run_python, sandbox_for
from mindgrpo.tools import remote
from mindgrpo.tools.remote import MAX_ANSWER_BYTES, MAX_CODE_BYTES, SandboxServiceError

LIMITS = SandboxLimits(wall_seconds=5)


class Stub(BaseHTTPRequestHandler):
    """SandboxFusion's /run_code: runs the code with this interpreter (the tests' own code: the stub isolates
    nothing) and answers as SandboxFusion does, or misbehaves as ``server.behaviour`` says."""

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.requests.append((self.path, request))
        behaviour = self.server.behaviour
        if behaviour == "http 500":
            self.send_error(500, "Internal Server Error")
            return
        if behaviour == "slow":
            time.sleep(3)
        body = {"not json": b"<html>busy</html>", "huge": b"x" * (MAX_ANSWER_BYTES + 10),
                "sandbox error": json.dumps({"status": "SandboxError", "message": "no runner for python",
                                             "run_result": None}).encode()}.get(behaviour)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body if body is not None else json.dumps(self.run_code(request)).encode())

    @staticmethod
    def run_code(request):
        try:
            done = subprocess.run([sys.executable, "-c", request["code"]], capture_output=True, text=True,
                                  timeout=request["run_timeout"])
        except subprocess.TimeoutExpired:
            run = {"status": "TimeLimitExceeded", "execution_time": request["run_timeout"], "return_code": None,
                   "stdout": "", "stderr": ""}
        else:
            run = {"status": "Finished", "execution_time": 0.01, "return_code": done.returncode,
                   "stdout": done.stdout, "stderr": done.stderr}
        status = "Success" if run["return_code"] == 0 else "Failed"
        return {"status": status, "message": "", "compile_result": None, "run_result": run,
                "executor_pod_name": None, "files": {}}

    def log_message(self, *args):
        pass


@pytest.fixture
def service():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Stub)
    server.daemon_threads = True
    server.requests, server.behaviour = [], "run"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    server.url = f"http://127.0.0.1:{server.server_address[1]}/run_code"
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_the_request_is_sandboxfusions_and_the_answer_reads_as_a_local_sandboxs(service):
    sandbox = sandbox_for("remote", service.url)
    assert sandbox.problem() == ""  # it ran 6 * 7
    result = run_python("import math\nx = math.factorial(5)\nprint('x is', x)\nx + 1", LIMITS, sandbox)
    assert result.ok and result.text() == "x is 120\n121"
    path, request = service.requests[-1]
    assert path == "/run_code" and request["language"] == "python" and request["run_timeout"] == 5
    assert request["memory_limit_MB"] == LIMITS.memory_bytes >> 20 and request["compile_timeout"] == 5
    assert (request["stdin"], request["files"], request["fetch_files"]) == ("", {}, [])
    failed = run_python("def f():\n    return 1 / 0\nf()", LIMITS, sandbox)
    assert failed.exit_code == 1 and failed.text().endswith("ZeroDivisionError: division by zero")
    assert 'File "<code>", line 2, in f' in failed.text() and "exec(" not in failed.text()  # the model's frames
    assert run_python("import time\ntime.sleep(30)", SandboxLimits(wall_seconds=1), sandbox).text() == \
        "[killed: time limit]"
    loud = run_python("print('x' * 100000)", LIMITS, sandbox)
    assert loud.text().endswith("[output truncated: too long]") and len(loud.output) == LIMITS.output_bytes


@pytest.mark.parametrize("behaviour, message", [
    ("http 500", "answered HTTP 500"),
    ("not json", "an answer that is not SandboxFusion's"),
    ("sandbox error", "failed to run the code: no runner for python"),
    ("slow", "did not answer within 1 s"),
])
def test_a_failing_service_is_an_error_of_the_call(behaviour, message, service, monkeypatch):
    monkeypatch.setattr(remote, "HTTP_MARGIN_SECONDS", 0.5)  # the call's wall time + this
    service.behaviour = behaviour
    with pytest.raises(SandboxServiceError, match=message):
        run_python("print(1)", SandboxLimits(wall_seconds=0.5), sandbox_for("remote", service.url))


def test_size_caps_answer_without_sending_or_reading_too_much(service):
    sandbox = sandbox_for("remote", service.url)
    big = run_python("#" * (MAX_CODE_BYTES + 1), LIMITS, sandbox)
    assert not big.ok and f"at most {MAX_CODE_BYTES}" in big.text() and service.requests == []
    service.behaviour = "huge"
    assert run_python("print(1)", LIMITS, sandbox).text() == "[output truncated: too long]"


def test_in_a_run_every_failure_is_a_tool_answer_and_the_runner_goes_on(service, monkeypatch):
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}/run_code"
    runner = ToolRunner(resolve_tools(["python"], sandbox_for("remote", service.url)), processes=1, timeout=30)
    try:
        service.behaviour = "sandbox error"
        failed = runner.run([ToolCall("python", {"code": "print(1)"})])[0]
        assert failed.error and failed.text.startswith("Error: python raised SandboxServiceError: the sandbox "
                                                       "service at http://127.0.0.1:") and "no runner" in failed.text
        service.behaviour = "run"
        assert runner.run([ToolCall("python", {"code": "6 * 7"})])[0].text == "42"
    finally:
        runner.close()
    with pytest.raises(SandboxServiceError, match="could not be reached"):
        run_python("print(1)", LIMITS, sandbox_for("remote", dead))


def test_the_run_checks_the_service_before_it_starts(service):
    from mindgrpo.train.preflight import run_tools

    config = GRPOConfig()
    config.rl_config.tools = ["python"]
    config.rl_config.tool_sandbox = "remote"
    with pytest.raises(ConfigError, match=r"rl_config.tool_sandbox_url = '': tool_sandbox remote needs"):
        validate(config, check_paths=False)
    config.rl_config.tool_sandbox_url = service.url
    validate(config, check_paths=False)
    assert [tool.sandbox.url for tool in run_tools(config)] == [service.url]
    service.behaviour = "http 500"
    config.rl_config.tool_sandbox_url = service.url + "?down"  # another URL: checked anew
    with pytest.raises(ConfigError, match=r"^rl_config.tool_sandbox = remote: the sandbox service at .* answered HTTP "
                                          r"500"):
        run_tools(config)
    config.rl_config.tool_sandbox = "bwrap"
    with pytest.raises(ConfigError, match="rl_config.tool_sandbox_url is set but rl_config.tool_sandbox = bwrap"):
        validate(config, check_paths=False)


def test_the_config_and_the_sandbox_read_the_url_alike(service):
    """One check of the URL (mindgrpo.config.validate.sandbox_url_problem) for the config and for the sandbox that
    mindgrpo eval --tool-sandbox-url makes: a URL one accepts the other does not refuse."""
    config = GRPOConfig()
    config.rl_config.tools = ["python"]
    config.rl_config.tool_sandbox = "remote"
    host = service.url.split("://", 1)[1]
    for url, usable in (("", False), ("sandbox:8080/run_code", False), ("ftp://sandbox/run_code", False),
                        ("http://", False), ("http://[::1/run_code", False), (f"HTTP://{host}", True)):
        config.rl_config.tool_sandbox_url = url
        try:
            validate(config, check_paths=False)
            config_problem = ""
        except ConfigError as err:
            config_problem = str(err)
        sandbox_problem = sandbox_for("remote", url).problem()
        assert (config_problem == "") == (sandbox_problem == "") == usable, (url, config_problem, sandbox_problem)
        if not usable:
            assert "needs the service's http(s) /run_code URL" in config_problem, config_problem
            assert sandbox_problem.startswith("needs the service's http(s) /run_code URL"), sandbox_problem


def test_a_failed_check_of_the_service_is_not_remembered(service):
    """A service that was down (starting, restarting) when a check ran passes the next one; one that answered is
    checked once per process."""
    sandbox = sandbox_for("remote", service.url + "?restarting")
    service.behaviour = "http 500"
    assert "answered HTTP 500" in sandbox.problem()
    service.behaviour = "run"
    assert sandbox.problem() == ""
    service.behaviour = "http 500"
    assert sandbox.problem() == ""
