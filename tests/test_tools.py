"""Tools for multi-turn rollouts (mindgrpo.tools): Qwen2.5's format against its own chat template rendered by
transformers, the calculator, the python sandbox against what model-written code tries, user tools, and a runner
that answers every failure with a text."""
import json
import socket
import time
import uuid
from pathlib import Path

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from mindgrpo.choices import TOOL_SANDBOXES
from mindgrpo.tools import (SANDBOXES, SandboxLimits, ToolCall, ToolRunner, ToolSpecError, parse_calls, resolve_tool,
                            resolve_tools, responses_text, run_python, sandbox_for, system_turn)
from mindgrpo.tools.calculator import calculator

TEMPLATE = (Path(__file__).parent / "fixtures" / "qwen2_5_chat_template.jinja").read_text()
LIMITS = SandboxLimits(wall_seconds=5, cpu_seconds=2)
LOCAL = [mode for mode in SANDBOXES if mode != "remote"]  # tests/test_sandbox_remote.py runs the remote one


def render(messages, tools, **kwargs):
    return render_jinja_template([messages], tools=tools, chat_template=TEMPLATE, **kwargs)[0][0]


# ------------------------------------------------------------------------------------------------ format
@pytest.mark.parametrize("system", [None, "You solve arithmetic."])
def test_the_prompt_and_the_tool_turns_are_what_qwen2_5s_template_renders(system):
    tools = [tool.signature for tool in resolve_tools(["calculator", "python"])]
    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": "12*34?"}]
    prompt = render(messages, tools, add_generation_prompt=True)
    assert prompt == system_turn(tools, system) + "<|im_start|>user\n12*34?<|im_end|>\n<|im_start|>assistant\n"
    # the model's turn (what it samples, up to its <|im_end|>), two results, and the next assistant turn
    calls = [{"name": "calculator", "arguments": {"expression": "12*34"}},
             {"name": "python", "arguments": {"code": "print(12*34)"}}]
    conversation = messages + [{"role": "assistant", "content": "Let me compute.",
                                "tool_calls": [{"type": "function", "function": c} for c in calls]},
                               {"role": "tool", "content": "408"}, {"role": "tool", "content": "408\n"}]
    full = render(conversation, tools, add_generation_prompt=True)
    model_turn = "Let me compute." + "".join(
        f'\n<tool_call>\n{{"name": "{c["name"]}", "arguments": {json.dumps(c["arguments"])}}}\n</tool_call>'
        for c in calls) + "<|im_end|>"
    assert full == prompt + model_turn + responses_text(["408", "408\n"])
    assert parse_calls(model_turn) == [ToolCall(c["name"], c["arguments"]) for c in calls]


def test_tool_calls_are_parsed_and_malformed_ones_say_why():
    assert parse_calls("The answer is 4.") == []
    assert parse_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>') == [ToolCall("f", {"a": 1})]
    assert parse_calls('<tool_call>\n{"name": "f"}\n</tool_call>') == [ToolCall("f", {})]
    bad_json, no_name, bad_args = parse_calls('<tool_call>{"name": "f",</tool_call> <tool_call>[1]</tool_call>'
                                              '<tool_call>{"name": "g", "arguments": [1]}</tool_call>')
    assert "not valid JSON" in bad_json.error and '"name"' in no_name.error
    assert bad_args.name == "g" and "JSON object" in bad_args.error


# ------------------------------------------------------------------------------------------------ calculator
@pytest.mark.parametrize("expression, value", [("127 * 46", "5842"), ("(1 + 2) / 4", "0.75"), ("-3 - -2", "-1"),
                                               ("6 / 3", "2"), ("7 // 2 + 7 % 2", "4"), ("2 ** 10", "1024")])
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculator(expression) == value == str(eval(expression)).removesuffix(".0")


@pytest.mark.parametrize("expression, message", [("__import__('os').system('ls')", "only numbers"),
                                                 ("9 ** 9 ** 9", "too large"), ("10 ** 5000", "too large"),
                                                 ("x + 1", "only numbers"), ("1 +", "not an arithmetic"),
                                                 ("1 / 0", "division by zero")])
def test_calculator_refuses_what_is_not_bounded_arithmetic(expression, message):
    with pytest.raises((ValueError, ZeroDivisionError), match=message):
        calculator(expression)


# ------------------------------------------------------------------------------------------------ sandbox
def test_the_sandboxes_are_the_configs_choices():
    assert tuple(SANDBOXES) == TOOL_SANDBOXES
    with pytest.raises(ToolSpecError, match="unknown tool sandbox 'docker': choose one of bwrap, process, remote"):
        sandbox_for("docker")


@pytest.mark.parametrize("mode", LOCAL)
def test_sandbox_runs_code_like_a_notebook_cell(mode):
    sandbox = sandbox_for(mode)
    result = run_python("import math\nx = math.factorial(5)\nprint('x is', x)\nx + 1", LIMITS, sandbox)
    assert result.ok and result.text() == "x is 120\n121"
    assert run_python("open('note.txt', 'w').write('kept')\nopen('note.txt').read()", LIMITS, sandbox).text() == \
        "'kept'"
    failed = run_python("def f():\n    return 1 / 0\nf()", LIMITS, sandbox)
    assert failed.exit_code == 1 and failed.text().endswith("ZeroDivisionError: division by zero")
    assert 'File "<code>", line 2, in f' in failed.text() and "hook" not in failed.text()  # the model's frames only
    assert run_python("import numpy\nint(numpy.arange(10).sum())", LIMITS, sandbox).text() == "45"


@pytest.fixture
def run_files(tmp_path):
    """A file standing for the run's checkpoints and one in a home folder: what the code must not touch."""
    checkpoint = tmp_path / "output" / "checkpoint-10" / "model.safetensors"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights")
    home = Path.home() / f".mindgrpo-sandbox-test-{uuid.uuid4().hex}"  # unique: pytest workers run side by side
    home.write_text("token")
    yield [checkpoint, home]
    home.unlink()


ATTACKS = {
    "read": "print(open({path!r}).read())",
    "write": "open({path!r}, 'w').write('overwritten')",
    "delete": "import os\nos.remove({path!r})",
    "rename": "import os\nos.rename({path!r}, {path!r} + '.moved')",
    "list": "import os\nprint(os.listdir(os.path.dirname({path!r})))",
    "shell": "import os\nos.system('rm -f ' + {path!r})",
    "subprocess": "import subprocess\nsubprocess.run(['rm', '-f', {path!r}])",
    "ctypes": "import ctypes\nctypes.CDLL(None).unlink({path!r}.encode())",
}


@pytest.mark.parametrize("attack", ATTACKS)
def test_the_audit_hook_refuses_what_careless_code_tries_with_a_readable_error(attack, run_files):
    """In the process sandbox the hook is all there is between careless code and the run's files (code written to
    escape switches it off: tests/test_sandbox_escapes.py). Under bwrap those files are not there at all."""
    before = [(p.read_bytes(), p.stat().st_mtime_ns) for p in run_files]
    for path in run_files:
        result = run_python(ATTACKS[attack].format(path=str(path)), LIMITS, sandbox_for("process"))
        assert result.exit_code == 1 and "PermissionError" in result.text(), result.text()
        assert "not allowed" in result.text() or "may not" in result.text(), result.text()
        assert "weights" not in result.output and "token" not in result.output
    assert [(p.read_bytes(), p.stat().st_mtime_ns) for p in run_files] == before
    assert sorted(p.name for p in run_files[0].parent.iterdir()) == ["model.safetensors"]


@pytest.mark.parametrize("mode", LOCAL)
def test_sandboxed_code_has_no_network(mode):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.5)
    port = server.getsockname()[1]
    try:
        for code in (f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)",
                     "import urllib.request\nurllib.request.urlopen('http://example.com', timeout=2)"):
            result = run_python(code, LIMITS, sandbox_for(mode))
            assert result.exit_code == 1 and "not allowed in the sandbox" in result.text(), result.text()
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever connected
    finally:
        server.close()


@pytest.mark.parametrize("code, expect", [
    ("import os\nwhile True:\n    os.fork()", "os.fork is not allowed"),
    ("import multiprocessing\nmultiprocessing.Process(target=print).start()", "not allowed"),
    ("x = bytearray(10 * 2 ** 30)", "MemoryError"),
    ("while True:\n    pass", "[killed: CPU time limit]"),
    ("import time\ntime.sleep(60)", "[killed: time limit]"),  # cut at LIMITS.wall_seconds
    ("import os, time\nos.close(1)\nos.close(2)\ntime.sleep(30)", "[killed: time limit]"),  # no output, no CPU time
    ("while True:\n    print('x' * 1000)", "[output truncated: too long]"),
    ("import os\nos.kill(os.getppid(), 9)", "os.kill is not allowed"),
    ("open('big', 'w').write('x' * (20 << 20))", "File too large"),
])
@pytest.mark.parametrize("mode", LOCAL)
def test_runaway_code_fails_or_is_cut_inside_the_sandbox(mode, code, expect):
    start = time.monotonic()
    result = run_python(code, LIMITS, sandbox_for(mode))
    assert expect in result.text() and not result.ok, result.text()
    assert len(result.output.encode()) <= LIMITS.output_bytes
    assert time.monotonic() - start < LIMITS.wall_seconds + 3


# ------------------------------------------------------------------------------------------------ registry
def test_user_tools_get_their_signature_from_the_docstring_or_the_decorator():
    price = resolve_tool("tool_examples:lookup_price")
    assert price.name == "lookup_price" and price.signature["function"]["parameters"] == {
        "type": "object", "required": ["item"],
        "properties": {"item": {"type": "string", "description": "the item's name"},
                       "quantity": {"type": "integer", "description": "how many"}}}
    greet = resolve_tool("tool_examples:greet")
    assert greet.signature["function"]["description"] == "Greets someone."
    assert price.check_arguments({"item": "apple"}) == "" and "lookup_price takes (item, quantity)" in \
        price.check_arguments({"thing": "apple"})


@pytest.mark.parametrize("spec, message", [
    ("calculater", "unknown tool 'calculater': the built-in tools are calculator, python"),
    ("tool_examples:no_docstring", "no JSON signature from its docstring"),
    ("tool_examples:lookup_prize", "Did you mean 'lookup_price'"),
    ("no_such_module:f", "module 'no_such_module' not found"),
    ("tool_examples:Unprintable", "not a function"),
])
def test_a_tool_that_cannot_be_used_is_refused_by_name(spec, message):
    with pytest.raises(ToolSpecError, match=message.replace("(", r"\(")):
        resolve_tool(spec)
    with pytest.raises(ToolSpecError, match="given twice"):
        resolve_tools(["calculator", "calculator"])


# ------------------------------------------------------------------------------------------------ runner
def test_every_failing_call_answers_with_an_error_text_and_the_runner_goes_on():
    tools = resolve_tools(["calculator", "python", "tool_examples:lookup_price", "tool_examples:hang",
                           "tool_examples:unprintable", "tool_examples:die"])
    runner = ToolRunner(tools, processes=2, timeout=3)
    try:
        calls = [ToolCall("calculator", {"expression": "127 * 46"}),
                 ToolCall("lookup_price", {"item": "pear", "quantity": 4}),
                 ToolCall("python", {"code": "sum(range(10))"}),
                 ToolCall("calculator", {"expression": "1 / 0"}),
                 ToolCall("hang", {"seconds": 30}),
                 ToolCall("unprintable", {}),
                 ToolCall("die", {}),
                 ToolCall("websearch", {"q": "x"}),
                 ToolCall("calculator", {"expr": "1"}),
                 ToolCall(error="the tool call is not valid JSON")]
        start = time.monotonic()
        results = runner.run(calls)
        assert time.monotonic() - start < 20
        assert [r.text for r in results[:3]] == ["5842", "3.0", "45"] and not any(r.error for r in results[:3])
        assert all(r.error for r in results[3:])
        texts = [r.text for r in results[3:]]
        assert texts[0] == "Error: calculator raised ZeroDivisionError: division by zero"
        assert texts[1] == "Error: hang took longer than 3 s and was stopped" and results[4].timed_out
        assert "cannot print me" in texts[2] and "exit status 3" in texts[3]
        assert texts[4] == "Error: there is no tool 'websearch'; the tools are calculator, python, lookup_price, " \
                           "hang, unprintable, die"
        assert texts[5].startswith("Error: calculator takes (expression)") and "not valid JSON" in texts[6]
        assert runner.run([ToolCall("calculator", {"expression": "2 + 2"})])[0].text == "4"  # still serving
    finally:
        runner.close()


# ------------------------------------------------------------------------------------------------ turns
def test_tool_turns_answer_calls_with_the_templates_tokens_and_end_turns_without_calls(tiny_model_dir):
    """ToolTurns (the rollout's TurnHandler): a turn's calls run, and the answer is the tokenised user turn Qwen2.5's
    template renders after it; the prompt, the model's own ids and the answer decode to the template's rendering of
    the whole conversation. A turn without a call, or past max_turns, ends the completion; long results are cut."""
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.tools import ToolTurns

    tokenizer = load_tokenizer(tiny_model_dir)
    tools = resolve_tools(["calculator", "python"])
    runner = ToolRunner(tools, processes=1, timeout=10)
    turns = ToolTurns(tokenizer, runner, max_turns=2, max_response_tokens=12)
    try:
        call = {"name": "calculator", "arguments": {"expression": "127 * 46"}}
        model_turn = f"Let me compute.\n<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>"
        messages = [{"role": "user", "content": "What is 127 * 46?"}]
        signatures = [tool.signature for tool in tools]
        prompt = tokenizer.encode(render(messages, signatures, add_generation_prompt=True))
        turn = tokenizer.encode(model_turn)
        plain = tokenizer.encode("It is 5842.<|im_end|>")
        loud = tokenizer.encode('<tool_call>\n{"name": "python", "arguments": {"code": "print(\'ab \' * 500)"}}\n'
                                "</tool_call><|im_end|>")
        answers = turns.respond([turn, plain, turn, loud], [1, 1, 3, 2])
        assert answers[0] == tokenizer.encode(responses_text(["5842"]))
        assert answers[1] is None and answers[2] is None  # no call; a call past max_turns
        conversation = messages + [{"role": "assistant", "content": "Let me compute.",
                                    "tool_calls": [{"type": "function", "function": call}]},
                                   {"role": "tool", "content": "5842"}]
        assert tokenizer.decode(prompt + turn + answers[0], skip_special_tokens=False) == render(
            conversation, signatures, add_generation_prompt=True)
        cut = tokenizer.decode(answers[3], skip_special_tokens=False)
        assert "[output truncated]" in cut and cut.count("ab") < 20
        stats = turns.take_stats()
        assert 0 < stats.pop("seconds") < 30
        assert stats == {"calls": 2, "errors": 0, "timeouts": 0, "truncated": 1, "over_turn_limit": 1}
        assert turns.take_stats()["calls"] == 0  # taken: counts start again
    finally:
        runner.close()


def test_turns_read_the_models_own_ids_which_re_tokenising_would_change(tiny_model_dir):
    """A model can sample a word letter by letter where the tokeniser has fewer tokens for it. Its text then
    re-tokenises to other ids (so a loss mask built from re-tokenised text would be out of step with what was
    sampled); ToolTurns only decodes the turn to read the call, and answers it."""
    from mindgrpo.data.tokenizer import load_tokenizer
    from mindgrpo.tools import ToolTurns

    tokenizer = load_tokenizer(tiny_model_dir)
    apart = [tokenizer.encode(letter)[0] for letter in "expression"]
    head = tokenizer.encode('<tool_call>\n{"name": "calculator", "arguments": {"')
    tail = tokenizer.encode('": "127 * 46"}}\n</tool_call><|im_end|>')
    turn = head + apart + tail
    retokenised = tokenizer.encode(tokenizer.decode(turn, skip_special_tokens=False))
    assert retokenised != turn and len(retokenised) < len(turn)
    runner = ToolRunner(resolve_tools(["calculator"]), processes=1, timeout=10)
    try:
        answer = ToolTurns(tokenizer, runner, max_turns=1, max_response_tokens=16).respond([turn], [1])[0]
    finally:
        runner.close()
    assert answer == tokenizer.encode(responses_text(["5842"]))
