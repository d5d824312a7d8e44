"""Anthropic's Messages API (POST /v1/messages, non-streaming) against a
real `darkserve serve`, through the official `anthropic` client, and raw
HTTP for the error shape. Expected texts come from darkserve's own chat
route with the same messages and greedy decoding, never from hard-coded
model outputs.
"""
import anthropic
import pytest


# the client (2.17) has no sampling arguments any more; the API field still works
GREEDY = {"temperature": 0}


def client(srv):
    return anthropic.Anthropic(base_url=srv.url(), api_key="unused", max_retries=0, timeout=300)


def chat(srv, msgs, **kw):
    st, r, _ = srv.post("/v1/chat/completions", dict(messages=msgs, temperature=0, **kw))
    assert st == 200, r
    return r


def test_messages_create_is_the_chat_answer(tiny):
    c = client(tiny)
    m = c.messages.create(model="tiny", max_tokens=12, extra_body=GREEDY,
                          system="Be brief.", messages=[{"role": "user", "content": "Hi"}])
    want = chat(tiny, [{"role": "system", "content": "Be brief."},
                       {"role": "user", "content": "Hi"}], max_tokens=12)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert len(m.content) == 1 and m.content[0].type == "text"
    assert m.content[0].text == want["choices"][0]["message"]["content"]
    assert m.usage.input_tokens == want["usage"]["prompt_tokens"]
    assert m.usage.output_tokens == want["usage"]["completion_tokens"]
    fin = want["choices"][0]["finish_reason"]
    assert m.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[fin]
    # text blocks, a system as blocks and a conversation of several turns
    m2 = c.messages.create(model="tiny", max_tokens=12, extra_body=GREEDY,
                           system=[{"type": "text", "text": "Be brief."}],
                           messages=[{"role": "user", "content": [{"type": "text", "text": "H"},
                                                                  {"type": "text", "text": "i"}]}])
    assert m2.content[0].text == m.content[0].text


def test_stop_sequence(tiny):
    c = client(tiny)
    msgs = [{"role": "user", "content": "Count"}]
    free = c.messages.create(model="tiny", max_tokens=40, extra_body=GREEDY, messages=msgs)
    text = free.content[0].text
    assert len(text) > 8
    word = text[4:7]
    m = c.messages.create(model="tiny", max_tokens=40, extra_body=GREEDY, messages=msgs,
                          stop_sequences=[word])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == word
    assert m.content[0].text == text[:text.index(word)]


def test_refusals_in_anthropics_shape(tiny):
    def refused(body, status=400):
        st, r, _ = tiny.post("/v1/messages", body)
        assert st == status, r
        assert r["type"] == "error" and set(r["error"]) == {"type", "message"}, r
        assert r["error"]["type"] == "invalid_request_error" and r["error"]["message"], r
        return r["error"]["message"]
    base = {"model": "tiny", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]}
    assert "Extra inputs" in refused(dict(base, frequency_penalty=1))
    assert "max_tokens" in refused({k: v for k, v in base.items() if k != "max_tokens"})
    assert "tools" in refused(dict(base, tools=[{"name": "f", "input_schema": {}}]))
    assert "stream" in refused(dict(base, stream=True))
    assert "image" in refused(dict(base, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}]}]))
    refused(dict(base, messages=[{"role": "system", "content": "x"}]))
    refused(dict(base, temperature=1.5))
    refused(dict(base, messages=[]))
    with pytest.raises(anthropic.BadRequestError):
        client(tiny).messages.create(model="tiny", max_tokens=8, messages=base["messages"],
                                     extra_body={"unknown_field": 1})
