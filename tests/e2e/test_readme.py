"""The README's examples run as written, so they cannot drift: its python blocks (the client against
the test's services, the offline LLM on the tiny model) and its client commands (`nanoserve
generate`, grpcurl when installed). Only the address, model path and device are substituted, and the
test fails if the README no longer spells them as expected."""

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nanoserve import Client
from tests.e2e.processes import REPO_ROOT

pytestmark = pytest.mark.e2e

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
ADDRESS = "127.0.0.1:50051"


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def substituted(code: str, replacements: dict[str, str]) -> str:
    for old, new in replacements.items():
        assert old in code, f"the README example no longer contains {old!r}:\n{code}"
        code = code.replace(old, new)
    return code


def run_python(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_readme_has_the_examples_this_test_runs() -> None:
    assert len(blocks("python")) == 4
    assert "nanoserve generate --address 127.0.0.1:50051" in README.replace("\n", " ")


def test_client_example(services) -> None:
    (code,) = [b for b in blocks("python") if "Client(" in b]
    code = substituted(code, {f'"{ADDRESS}"': repr(services.frontend.address)})
    code += "\nassert reply.text and reply.finish_reason in ('stop', 'length'), reply\nprint()\n"
    out = run_python(code)
    assert out.strip(), "the streamed reply printed nothing"


def test_logprobs_example(services) -> None:
    (code,) = [b for b in blocks("python") if ".logprobs" in b and "Client(" not in b]
    client = f"from nanoserve import Client\nclient = Client({services.frontend.address!r})\n"
    out = run_python(client + code)
    lines = out.splitlines()
    assert 1 <= len(lines) <= 8 and all(line[:1] in "'\"" for line in lines), out


def test_offline_example(tiny_model_dir: Path) -> None:
    (code,) = [b for b in blocks("python") if "LLM(" in b]
    code = substituted(
        code,
        {
            '"/models/Qwen3-0.6B"': repr(str(tiny_model_dir)),
            'device="cuda"': 'device="cpu", num_kvcache_blocks=64',
        },
    )
    out = run_python(code)
    assert "length" in out or "stop" in out, out


def test_cli_generate_example(services) -> None:
    command = re.search(r'`(nanoserve generate --address \S+ "[^"]*")`', README.replace("\n", " "))
    assert command, 'the README no longer shows `nanoserve generate --address ... "..."`'
    argv = shlex.split(command.group(1).replace(ADDRESS, services.frontend.address))
    cli = [sys.executable, "-m", "nanoserve.cli", *argv[1:]]  # `nanoserve` of this interpreter
    done = subprocess.run(cli, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()


def test_grpcurl_example(services) -> None:
    if shutil.which("grpcurl") is None:
        pytest.skip("grpcurl is not installed: the README's grpcurl example is not run here")
    (code,) = [b for b in blocks("bash") if "grpcurl" in b]
    code = substituted(code, {ADDRESS: services.frontend.address})
    done = subprocess.run(["bash", "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"finishReason"' in done.stdout


GATEWAY_URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def gateway(services):
    pytest.importorskip("fastapi", reason="the gateway extra: pip install '.[gateway]'")
    from tests.e2e.gateway_process import start_gateway

    gateway = start_gateway(services.frontend.address)
    yield gateway
    gateway.stop()


def test_gateway_sdk_example(gateway) -> None:
    pytest.importorskip("openai", reason="pip install openai (the dev extra)")
    (code,) = [b for b in blocks("python") if "OpenAI(" in b]
    code = substituted(code, {GATEWAY_URL: f"http://127.0.0.1:{gateway.port}"})
    out = run_python(code)
    assert "completion_tokens=" in out, out


def test_gateway_curl_example(gateway, services) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed: the README's curl example is not run here")
    (code,) = [b for b in blocks("bash") if "nanoserve gateway" in b]
    start, *curls = code.strip().split("\n", 1)
    assert start.startswith("nanoserve gateway --frontend-address 127.0.0.1:50051 --port 8000")
    with Client(services.frontend.address) as client:
        model = client.model_info().model_name
    script = substituted(
        curls[0],
        {
            GATEWAY_URL: f"http://127.0.0.1:{gateway.port}",
            '"model": "tiny-qwen3-v1"': f'"model": "{model}"',
        },
    )
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert '"object":"list"' in done.stdout and '"chat.completion"' in done.stdout
