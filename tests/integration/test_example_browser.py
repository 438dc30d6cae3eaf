"""examples/fastapi_chat's page in a real headless browser (Debian's chromium, driven by
playwright), as a person uses it: send a message and watch the answer stream in, reload, two tabs,
a web tier killed in the middle of a turn, the server restarted. After each, every message is on
the page once, the stream never sent one twice, and the store holds each once.

CI installs chromium (.ci/run) and sets KVSTORE_REQUIRE_BROWSER=1, so there a missing browser
fails the run; elsewhere these tests are skipped without it (`apt-get install chromium`)."""

from __future__ import annotations

import os
import re
import shutil

import pytest

from kvstore import MessageStore, UserMessage

from ..support.example_app import deployment

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
if os.environ.get("KVSTORE_REQUIRE_BROWSER") == "1":  # CI: never skipped
    from playwright import sync_api

    if not os.path.exists(CHROMIUM):
        raise RuntimeError("KVSTORE_REQUIRE_BROWSER=1 but chromium is not installed")
else:
    sync_api = pytest.importorskip("playwright.sync_api")
    if not os.path.exists(CHROMIUM):
        pytest.skip("chromium is not installed (apt-get install chromium)", allow_module_level=True)
expect = sync_api.expect

# The fake model's pause between two fragments: a turn streams for about 2 s, long enough to
# see it stream and to kill its producer in the middle.
MODEL_DELAY = 0.2
TURN = ["user_message", "tool_call_message", "tool_return_message", "assistant_message"]
ANSWER = "It is sunny and 21 degrees."
WAIT = 30_000  # ms
USER = "guest"  # the page's user until one is typed in: its threads are this owner's


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    yield from deployment(tmp_path_factory.mktemp("browser"), model_delay=MODEL_DELAY)


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM)
        yield browser
        browser.close()


@pytest.fixture
def tab(browser, app):
    """tab(thread_id): a new tab with the thread's page open and its stream live."""
    context = browser.new_context()

    def open_tab(thread_id: str):
        page = context.new_page()
        page.goto(f"{app.url}/#{thread_id}")
        expect(page.locator("#status")).to_have_text("live", timeout=WAIT)
        return page

    yield open_tab
    context.close()


def send(page, text: str) -> None:
    page.fill("#text", text)
    page.press("#text", "Enter")


def bubbles(page) -> list[tuple[str, str]]:
    """The messages on the page: (type, text) of each bubble, top to bottom."""
    return page.eval_on_selector_all(
        "#messages .msg", "els => els.map(e => [e.className.split(' ')[1], e.textContent])"
    )


def settled(page, count: int) -> None:
    """Waits until the page shows `count` stored messages and nothing half-streamed."""
    expect(page.locator("#messages .msg:not(.pending)")).to_have_count(count, timeout=WAIT)
    expect(page.locator("#messages .msg.pending")).to_have_count(0, timeout=WAIT)
    assert page.evaluate("window.chat.duplicates") == 0


def shown_once(page, app, thread_id: str, owner: str = USER) -> None:
    """Every stored message is on the page once, in order, and nothing else is."""
    with MessageStore.from_url(app.db_url) as store:
        stored = list(store.thread(thread_id, owner=owner).iter())
    ids = page.eval_on_selector_all("#messages .msg", "els => els.map(e => e.dataset.id)")
    assert ids == [m.id for m in stored]


def test_a_message_sent_streams_its_answer_into_two_tabs_and_a_reload_keeps_it(tab, app):
    first, second = tab("chat-b1"), tab("chat-b1")
    send(first, "weather in Oslo?")
    # The answer streams in: a bubble of its words before its message is stored.
    streaming = first.locator("#messages .assistant_message.pending")
    expect(streaming).to_have_text(re.compile(r"^It \S"), timeout=WAIT)
    for page in (first, second):
        settled(page, 4)
        assert [kind for kind, _ in bubbles(page)] == TURN
        assert bubbles(page)[-1][1] == ANSWER and "Oslo" in bubbles(page)[1][1]
        shown_once(page, app, "chat-b1")
    first.reload()
    settled(first, 4)
    send(second, "and in Rome?")
    for page in (first, second):
        settled(page, 8)
        assert [kind for kind, _ in bubbles(page)] == TURN * 2
        shown_once(page, app, "chat-b1")


def test_a_web_tier_killed_in_the_middle_of_a_turn_is_taken_over_by_the_retry(tab, app):
    page, watcher = tab("chat-b2"), tab("chat-b2")
    send(page, "weather in Paris?")
    expect(page.locator("#messages .tool_call_message.pending")).to_have_count(1, timeout=WAIT)
    app.kill_workers()  # the producer dies with its request; the page sends it again
    for each in (page, watcher):
        settled(each, 4)
        assert [kind for kind, _ in bubbles(each)] == TURN
        assert bubbles(each)[-1][1] == ANSWER and "Paris" in bubbles(each)[1][1]
        shown_once(each, app, "chat-b2")
        assert each.evaluate("window.chat.takeovers") == 1  # the retry's producer: lease 2
    with MessageStore.from_url(app.db_url) as store:
        turn = store.thread("chat-b2", owner=USER).snapshot().turn
    assert turn.outcome == "completed"


def test_a_server_restart_loses_nothing_and_shows_nothing_twice(tab, app):
    page = tab("chat-b3")
    send(page, "weather in Oslo?")
    settled(page, 4)
    app.stop_server()
    expect(page.locator("#status")).to_have_text("reconnecting", timeout=WAIT)
    send(page, "weather in Rome?")  # refused while the server is down: the page sends it again
    page.wait_for_timeout(1500)
    app.start_server()
    settled(page, 8)
    expect(page.locator("#status")).to_have_text("live", timeout=WAIT)
    assert [kind for kind, _ in bubbles(page)] == TURN * 2
    shown_once(page, app, "chat-b3")
    assert "Traceback" not in app.log_text()


def test_a_long_thread_opens_at_its_newest_page_and_pages_back(tab, app):
    with MessageStore.from_url(app.db_url) as store:
        thread = store.thread("chat-b4", owner=USER)
        thread.append([UserMessage(content=f"message {i}") for i in range(1, 121)])
    page = tab("chat-b4")
    settled(page, 50)
    texts = [text for _, text in bubbles(page)]
    assert texts == [f"message {i}" for i in range(71, 121)]
    for shown in (100, 120):
        page.click("#older")
        settled(page, shown)
    assert [text for _, text in bubbles(page)] == [f"message {i}" for i in range(1, 121)]
    expect(page.locator("#older")).to_be_hidden()
    shown_once(page, app, "chat-b4")


def sidebar(page) -> list[str]:
    return page.eval_on_selector_all("#threads li .title", "els => els.map(e => e.textContent)")


def test_the_sidebar_lists_the_users_threads_by_activity_and_deletes_and_forks(tab, app):
    page = tab("chat-s1")
    page.fill("#user", "sidebar-user")  # a user of this test's own: a new chat opens
    page.press("#user", "Enter")
    expect(page.locator("#threads li")).to_have_count(0, timeout=WAIT)
    expect(page.locator("#status")).to_have_text("live", timeout=WAIT)
    send(page, "weather in Oslo?")
    settled(page, 4)
    expect(page.locator("#threads li.current .title")).to_have_text(
        "weather in Oslo?", timeout=WAIT
    )
    page.click("#new")
    expect(page.locator("#status")).to_have_text("live", timeout=WAIT)
    send(page, "weather in Rome?")
    settled(page, 4)
    expect(page.locator("#threads li").first).to_have_text(re.compile("Rome"), timeout=WAIT)
    assert sidebar(page)[:2] == ["weather in Rome?", "weather in Oslo?"]
    # Back to the first: a new message moves it to the top.
    page.locator("#threads li", has_text="Oslo").locator(".title").click()
    settled(page, 4)
    send(page, "and in Bergen?")
    settled(page, 8)
    expect(page.locator("#threads li").first).to_have_text(re.compile("Oslo"), timeout=WAIT)
    # Fork it: the fork opens with the whole history, listed first.
    page.click("#fork")
    expect(page.locator("#threads li.current .title")).to_have_text(
        "weather in Oslo? (fork)", timeout=WAIT
    )
    settled(page, 8)
    fork_id = page.input_value("#thread")
    shown_once(page, app, fork_id, owner="sidebar-user")
    # Delete the Rome thread: gone from the sidebar and from the store.
    page.locator("#threads li", has_text="Rome").locator("button").click()
    expect(page.locator("#threads li", has_text="Rome")).to_have_count(0, timeout=WAIT)
    with MessageStore.from_url(app.db_url) as store:
        listed = [t.title for t in store.threads("sidebar-user").threads]
    assert "weather in Rome?" not in listed and listed[0] == "weather in Oslo? (fork)"
    # A reload keeps the sidebar: it is the store's, not the page's.
    page.reload()
    expect(page.locator("#threads li").first).to_have_text(re.compile("fork"), timeout=WAIT)
