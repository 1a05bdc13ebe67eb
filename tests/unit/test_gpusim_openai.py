"""The emulated inference server of each Ready pod: the OpenAI API, streamed and not, at the
pod's address, counting what it served."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import requests

from e2e.gpusim.openai import OpenAIEndpoints, Served, ServingPod, answer_tokens
from tests.support import free_port


@pytest.fixture
def endpoints() -> Iterator[tuple[OpenAIEndpoints, str]]:
    port = free_port()
    served = OpenAIEndpoints(Served())
    served.start()
    pod = ServingPod("uid-1", "127.0.0.1", port, ("llm", "chat"), "llama", 0.001)
    served.update([pod])
    try:
        yield served, f"http://127.0.0.1:{port}"
    finally:
        served.stop()


def test_a_completion_is_the_prompt_cycled_to_max_tokens(
    endpoints: tuple[OpenAIEndpoints, str],
) -> None:
    _, url = endpoints
    body = {"model": "llama", "prompt": "a b c", "max_tokens": 5}
    answer = requests.post(f"{url}/v1/completions", json=body, timeout=10).json()
    assert answer["choices"][0]["text"] == " a b c a b" == "".join(answer_tokens("a b c", 5))
    assert answer["usage"]["completion_tokens"] == 5
    chat = {"model": "llama", "messages": [{"role": "user", "content": "x y"}], "max_tokens": 3}
    answer = requests.post(f"{url}/v1/chat/completions", json=chat, timeout=10).json()
    assert answer["choices"][0]["message"]["content"] == " x y x"


def test_a_streamed_completion_is_server_sent_events_ending_in_done(
    endpoints: tuple[OpenAIEndpoints, str],
) -> None:
    served, url = endpoints
    body = {"model": "llama", "prompt": "hi there", "max_tokens": 4, "stream": True}
    response = requests.post(
        f"{url}/v1/completions", json=body, headers={"X-Request-Id": "r1"}, timeout=10
    )
    assert response.headers["Content-Type"].startswith("text/event-stream")
    events = [e[6:] for e in response.text.split("\n\n") if e.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == " hi there hi there"
    requests.post(f"{url}/v1/completions", json=body, headers={"X-Request-Id": "r1"}, timeout=10)
    assert served.served.describe(("llm", "chat")) == {
        "httpRequests": 2,
        "httpDuplicates": ["r1"],
    }


def test_bad_requests_say_what_is_wrong_and_a_pod_that_went_stops_serving(
    endpoints: tuple[OpenAIEndpoints, str],
) -> None:
    served, url = endpoints
    answer = requests.post(f"{url}/v1/chat/completions", json={"messages": []}, timeout=10)
    assert answer.status_code == 400 and "messages" in answer.json()["error"]["message"]
    assert requests.get(f"{url}/health", timeout=10).status_code == 200
    served.update([])
    with pytest.raises(requests.ConnectionError):
        requests.get(f"{url}/health", timeout=10)


def test_of_two_pods_at_one_address_the_later_one_serves(
    endpoints: tuple[OpenAIEndpoints, str],
) -> None:
    """kwok gives a deleted pod's IP to a new pod, maybe before the emulator saw the deletion:
    the new pod's workload must be the one that answers, and is counted."""
    served, url = endpoints
    port = int(url.rsplit(":", 1)[1])
    old = ServingPod("uid-1", "127.0.0.1", port, ("llm", "chat"), "llama", 0.001, 10.0)
    new = ServingPod("uid-2", "127.0.0.1", port, ("other", "chat"), "llama", 0.001, 20.0)
    served.update([old, new])
    body = {"model": "llama", "prompt": "a", "max_tokens": 1}
    assert requests.post(f"{url}/v1/completions", json=body, timeout=10).status_code == 200
    assert served.served.describe(("other", "chat"))["httpRequests"] == 1
    assert served.served.describe(("llm", "chat"))["httpRequests"] == 0
