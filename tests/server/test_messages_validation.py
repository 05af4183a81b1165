"""``/v1/messages`` validates as strictly as the OpenAI routes: every client mistake a 400
in the one error shape whose ``param`` names the field (paths as ``messages[0].content[0].text``),
never a 500, a silent coercion, ``param: null`` or a field the shape lacks."""

import json

import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server]

MODEL = "tiny"
HI = [{"role": "user", "content": "hi"}]


def body(**fields) -> str:
    return json.dumps({"model": MODEL, "max_tokens": 4, "messages": HI, **fields})


MESSAGES_MISTAKES = [  # (raw JSON body, param); each was a 500, a 200 or a wrong param before
    ('{"model": "\\ud800", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}', "model"),
    (body().replace('"max_tokens": 4', '"temperature": Infinity, "max_tokens": 4'), "temperature"),
    (body(temperature=1.5), "temperature"),
    (body(top_p=0), "top_p"),
    (body(max_tokens="4"), "max_tokens"),
    (body(max_tokens=True), "max_tokens"),
    (body(max_tokens=0), "max_tokens"),
    (body(stream="yes"), "stream"),
    ('{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud83d"}]}', "messages"),
    (
        '{"model": "tiny", "max_tokens": 4, "system": "\\udfff", "messages": [{"role": "user", "content": '
        '"hi"}]}',
        "system",
    ),
    (body(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
    (
        body(messages=[{"role": "user", "content": [{"type": "image", "source": {}}]}]),
        "messages[0].content[0].type",
    ),
    (body(messages=[{"role": "system", "content": "hi"}]), "messages[0].role"),
    (body(messages=[]), "messages"),
    # the prompt alone is too long
    (
        body(messages=[{"role": "user", "content": "word " * 8300}]),
        "messages",
    ),
    (body(max_tokens=8150, messages=[{"role": "user", "content": "word " * 100}]), "max_tokens"),
    ("{}", "model"),
]


@pytest.mark.parametrize(
    "payload,param", MESSAGES_MISTAKES, ids=[str(i) for i in range(len(MESSAGES_MISTAKES))]
)
def test_every_messages_mistake_is_a_400_naming_its_field(live, payload, param):
    status, answer = live.post_raw("/v1/messages", payload.encode())
    assert status == 400, answer
    assert answer["type"] == "error" and answer["error"]["type"] == "invalid_request_error"
    assert answer["error"]["message"].startswith(param), answer  # Anthropic's shape: the field first
    assert "got type 'text'" not in answer["error"]["message"]


CHAT_MISTAKES = [  # the same kinds on the OpenAI chat route: paths in the one style
    ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content[0].type"),
    ({"messages": [{"role": "user", "content": "word " * 8300}], "max_tokens": 1}, "messages"),
]


@pytest.mark.parametrize("fields,param", CHAT_MISTAKES, ids=[str(i) for i in range(len(CHAT_MISTAKES))])
def test_chat_names_the_same_fields_in_the_same_style(live, fields, param):
    status, answer = live.post("/v1/chat/completions", {"model": MODEL, **fields})
    assert status == 400 and answer["error"]["param"] == param, answer
