"""Export and import as a backup and restore of a thread, on real servers: the summary, turns,
sequences, deleted_before and ids come back; a restore is idempotent per message, resumable,
refuses a thread holding other messages, and reports its progress."""

from __future__ import annotations

import io
import json

import pytest

from kvstore import AssistantMessage, MessageStore, StoreConfig, SystemMessage, UserMessage, errors
from kvstore.cli import backup, commands
from kvstore.cli.progress import Progress

from ..support.layout_check import check_layout
from .test_migration import write_layout_1

SMALL = dict(window_size=8, chunk_size=4, retained_message_limit=12)


def build_thread(store: MessageStore, thread_id: str = "chat"):
    """A thread with a summary after compaction and retention, a finished and an open turn, a
    replaced message and a removed turn."""
    thread = store.thread(thread_id)
    for n in range(6):
        turn = f"turn-{n}"
        thread.append(UserMessage(content=f"question {n}", otid=f"q{n}"), turn_id=turn)
        thread.start_turn(turn)
        thread.append([AssistantMessage(content=f"answer {n}.{i}") for i in range(4)], turn_id=turn)
        thread.finish_turn(turn, "completed" if n % 2 else "steered")
    thread.append([UserMessage(content=f"loose {i}") for i in range(10)])
    last = thread.stats().next_sequence - 1
    thread.compact("what was said so far", last - 12)
    gone = thread.append(UserMessage(content="retract me", otid="gone"), turn_id="turn-gone")
    thread.start_turn("turn-gone")
    thread.append(AssistantMessage(content="and me"), turn_id="turn-gone")
    thread.remove_turn("turn-gone")
    thread.append(UserMessage(content="after the removed turn"))
    finished = thread.append(UserMessage(content="q done", otid="qd"), turn_id="done")
    thread.start_turn("done")
    thread.append(AssistantMessage(content="a done"), turn_id="done")
    thread.finish_turn("done")
    thread.replace(finished[0].id, UserMessage(content="q done, replaced", otid="qd"))
    thread.append(UserMessage(content="q open", otid="qo"), turn_id="open")
    thread.start_turn("open")
    thread.append(AssistantMessage(content="a open, partial"), turn_id="open")
    assert gone and thread.stats().deleted_before_sequence  # retention ran
    return thread


def view(thread, turns=("turn-5", "done", "open", "turn-gone")):
    """Everything a reader sees of a thread."""
    stats = thread.stats()
    snapshot = thread.snapshot()
    return {
        "messages": [m.to_dict() for m in thread.iter()],
        "context": [m.to_dict() for m in thread.context()],
        "stats": (
            stats.stored_messages,
            stats.next_sequence,
            stats.deleted_before_sequence,
            stats.summary_last_sequence,
            stats.stored_bytes,
            stats.media_bytes,
            stats.layout_version,
        ),
        "snapshot": (
            [m.to_dict() for m in snapshot.messages],
            snapshot.summary and snapshot.summary.to_dict(),
            snapshot.turn,
        ),
        "turns": {
            t: [m.seq_id for m in thread.list(turn_id=t, limit=1000).messages] for t in turns
        },
        "page": thread.list(limit=5, order="desc").deleted_before_sequence,
    }


@pytest.fixture
def stores(server, namespace, server_only):
    source = MessageStore.from_url(server.url, StoreConfig(namespace=namespace, **SMALL))
    target = MessageStore.from_url(server.url, StoreConfig(namespace=namespace + "r", **SMALL))
    yield source, target
    source.close()
    target.close()


def export_text(store: MessageStore, thread_id: str = "chat") -> str:
    out = io.StringIO()
    backup.export(store, thread_id, out, progress_out=io.StringIO())
    return out.getvalue()


def test_round_trip_restores_the_whole_thread(stores, raw_client):
    source, target = stores
    original = build_thread(source)
    text = export_text(source)
    header = json.loads(text.splitlines()[0])
    assert (
        header["kvstore_backup"] == 2
        and header["summary_last"] > 0
        and header["deleted_before"] > 1
    )

    progress = backup.ImportProgress()
    assert (
        backup.import_lines(target, "chat", io.StringIO(text), progress, progress_out=io.StringIO())
        > 0
    )
    restored = target.thread("chat")
    assert view(restored) == view(original)
    assert restored.context()[0].message_type == "summary_message"
    assert restored.get_by_otid("qd").content == original.get_by_otid("qd").content
    # A second import stores nothing; every message is counted as already stored.
    again = backup.ImportProgress()
    assert (
        backup.import_lines(target, "chat", io.StringIO(text), again, progress_out=io.StringIO())
        == 0
    )
    assert again.already == progress.stored and again.stored == 0
    # Turn results as recorded; the open turn stays open and takes the next reply.
    finished = [t["id"] for t in header["turns"] if t["outcome"] != "open"]
    assert "done" in finished and "open" not in finished
    for turn in finished:
        assert restored.finish_turn(turn, "failed") == original.finish_turn(turn, "failed")
    check_layout(raw_client, restored.keys, target.config)
    for thread in (original, restored):
        rest = AssistantMessage(
            id="message-rest", date="2026-01-02T03:04:05Z", content="the rest", otid="rest"
        )
        thread.append(rest, turn_id="open")
        assert thread.finish_turn("open").reply_count == 2
    assert view(restored) == view(original)


def test_an_interrupted_restore_run_again_is_whole(stores, raw_client):
    source, target = stores
    original = build_thread(source)
    lines = export_text(source).splitlines(keepends=True)

    def cut(after: int):
        for number, line in enumerate(lines):
            if number == after:
                raise KeyboardInterrupt
            yield line

    first = backup.ImportProgress()
    with pytest.raises(KeyboardInterrupt):
        backup.import_lines(target, "chat", cut(len(lines) // 2), first, progress_out=io.StringIO())
    assert 0 < target.thread("chat").stats().stored_messages < original.stats().stored_messages
    rest = backup.ImportProgress()
    backup.import_lines(target, "chat", iter(lines), rest, progress_out=io.StringIO())
    assert (
        rest.already == first.stored
        and first.stored + rest.stored == original.stats().stored_messages
    )
    assert view(target.thread("chat")) == view(original)
    check_layout(raw_client, target.thread("chat").keys, target.config)


def test_a_restore_over_other_messages_is_refused_and_writes_nothing(stores, raw_client):
    source, target = stores
    build_thread(source)
    text = export_text(source)
    other = target.thread("chat")
    other.append([UserMessage(content=f"other {i}") for i in range(3)])
    before = view(other, turns=())
    with pytest.raises(errors.RestoreConflict):
        backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO())
    assert view(other, turns=()) == before


def test_progress_to_a_non_terminal_is_periodic_lines(stores):
    source, target = stores
    thread = source.thread("long")
    for start in range(0, 600, 100):
        thread.append([UserMessage(content=f"m{start + i}") for i in range(100)])
    out, shown = io.StringIO(), io.StringIO()
    backup.export(source, "long", out, progress_out=shown, every=0)
    # A line per page read: iter's pages grow, 200 then 400 messages here.
    assert "\r" not in shown.getvalue()
    assert shown.getvalue().splitlines() == [
        "  exported: 200/600 messages (33%)",
        "  exported: 600/600 messages (100%)",
    ]
    shown = io.StringIO()
    backup.import_lines(target, "long", io.StringIO(out.getvalue()), progress_out=shown, every=0)
    assert shown.getvalue().splitlines()[-1] == "  restored: 600/600 messages (100%)"
    assert len(shown.getvalue().splitlines()) == 6  # a line per run of 100, here


def test_plain_lines_import_once_whatever_the_cut(stores):
    """An older export (message lines, no header) or a file of your own: messages without ids
    are stored once however often, and however cut, the file is imported (a repeated line is
    a message of its own: its id counts the identical lines before it in the file)."""
    _, target = stores
    lines = [
        json.dumps({"message_type": "user_message", "content": f"m{i}"}) + "\n" for i in range(240)
    ]
    lines += [json.dumps({"message_type": "user_message", "content": "same"}) + "\n"] * 10
    lines += [
        json.dumps({"message_type": "user_message", "content": f"o{i}", "otid": f"o{i}"}) + "\n"
        for i in range(50)
    ]
    first = backup.ImportProgress()
    backup.import_lines(target, "plain", iter(lines[:130]), first, progress_out=io.StringIO())
    assert first.stored == 130
    second = backup.ImportProgress()  # overlaps the first at another cut point: mixed batches
    backup.import_lines(target, "plain", iter(lines[50:]), second, progress_out=io.StringIO())
    assert (second.stored, second.already) == (170, 80)
    third = backup.ImportProgress()
    backup.import_lines(target, "plain", iter(lines), third, progress_out=io.StringIO())
    assert (third.stored, third.already) == (0, 300)
    assert [m.to_dict()["content"] for m in target.thread("plain").iter()] == [
        json.loads(line)["content"] for line in lines
    ]


def test_an_unreadable_record_fails_the_export_naming_it(stores, raw_client):
    source, _ = stores
    thread = source.thread("bad")
    thread.append([UserMessage(content=f"m{i}") for i in range(3)])
    raw_client.zremrangebyscore(thread.keys.window, 2, 2)
    raw_client.zadd(thread.keys.window, {b"\xc1\xc1 not a record": 2})
    out = io.StringIO()
    with pytest.raises(errors.RecordError, match="sequences 2;"):
        backup.export(source, "bad", out, progress_out=io.StringIO())
    lines = out.getvalue().splitlines()[1:]
    assert [json.loads(line)["message"]["seq_id"] for line in lines] == [1, 3]


def test_a_turn_record_of_the_first_layout_2_form_is_backed_up(stores, raw_client):
    """ "<start>|a-b,c-d" (the first layout-2 turn record) gives its messages their turn."""
    source, target = stores
    thread = source.thread("old-turn")
    thread.append([UserMessage(content=f"m{i}") for i in range(2)], turn_id="t")
    thread.append(UserMessage(content="between"))
    thread.append(AssistantMessage(content="r"), turn_id="t")
    raw_client.hset(thread.keys.turns, "t", "2|1-2,4-4")
    text = export_text(source, "old-turn")
    assert [json.loads(line).get("turn_id") for line in text.splitlines()[1:-1]] == [
        "t",
        "t",
        None,
        "t",
    ]
    assert json.loads(text.splitlines()[0])["turns"] == [
        {
            "id": "t",
            "start": 2,
            "outcome": "open",
            "replies": 2,
            "first": 2,
            "count": 0,
            "first_seq": 0,
            "last_seq": 0,
        }
    ]
    backup.import_lines(target, "old-turn", io.StringIO(text), progress_out=io.StringIO())
    assert [m.seq_id for m in target.thread("old-turn").list(turn_id="t").messages] == [1, 2, 4]
    assert target.thread("old-turn").finish_turn("t").reply_count == 2


def test_a_layout_1_thread_is_migrated_before_a_backup(stores, raw_client):
    source, _ = stores
    write_layout_1(raw_client, source.thread("legacy").keys, 5)
    with pytest.raises(errors.LayoutError, match="migrate"):
        backup.export(source, "legacy", io.StringIO(), progress_out=io.StringIO())


def test_progress_on_a_terminal_is_one_bar_redrawn():
    shown = io.StringIO()
    progress = Progress("restored", 300, shown, terminal=True)
    for _ in range(3):
        progress._last = 0.0  # as if a tenth of a second had passed
        progress.update(90, 10)
    progress.close()
    text = shown.getvalue()
    assert text.count("\n") == 1 and text.endswith("\n") and text.count("\r") == 3
    assert text.rstrip("\n").split("\r")[-1] == "  restored [" + "#" * 30 + "] 300/300"


def test_a_restore_into_a_layout_1_thread_is_refused(stores, raw_client):
    source, target = stores
    source.thread("chat").append([UserMessage(content=f"m{i}") for i in range(3)])
    text = export_text(source)
    raw_client.hset(target.thread("chat").keys.legacy, "x", "not a sequence")
    with pytest.raises(errors.LayoutError, match="layout-1"):
        backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO())


def test_runs_are_consecutive_sequences_of_one_turn():
    from kvstore._engine.core import BackedUpMessage, BackupState, restore_runs

    def item(sequence, turn=None):
        return BackedUpMessage(sequence, turn, UserMessage(content="-"))

    items = [
        item(1, "a"),
        item(2, "a"),
        item(3),
        item(5),
        item(6, "b"),
        *(item(s, "b") for s in range(7, 250)),
    ]
    runs = [[(i.sequence, i.turn_id) for i in run] for run in restore_runs(items)]
    assert [(run[0][0], run[-1][0], run[0][1]) for run in runs] == [
        (1, 2, "a"),
        (3, 3, None),
        (5, 5, None),
        (6, 105, "b"),
        (106, 205, "b"),
        (206, 249, "b"),
    ]
    with pytest.raises(errors.InvalidMessage, match="in order"):
        list(restore_runs([item(2), item(2)]))

    state = BackupState(ranges=sorted([(1, 2, "a"), (6, 249, "b"), (4, 4, "a")]))
    assert [state.turn_of(s) for s in (1, 2, 3, 4, 5, 6, 249, 250)] == [
        "a",
        "a",
        None,
        "a",
        None,
        "b",
        "b",
        None,
    ]


def test_a_restored_thread_written_since_keeps_what_it_has(stores):
    """Importing the backup again after the thread took new messages would set its turns and
    summary back: refused, nothing written."""
    source, target = stores
    build_thread(source)
    text = export_text(source)
    backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO())
    restored = target.thread("chat")
    restored.append(AssistantMessage(content="later"), turn_id="open")
    restored.finish_turn("open")
    before = view(restored)
    with pytest.raises(errors.RestoreConflict, match="past the backup"):
        backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO())
    assert view(restored) == before


def test_a_restored_thread_whose_turns_moved_since_keeps_them_when_imported_again(stores):
    """No new message, but a turn finished and another started since the import: importing the
    same backup again stores nothing and sets nothing back (its restore was finished)."""
    source, target = stores
    build_thread(source)
    text = export_text(source)
    backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO())
    restored = target.thread("chat")
    restored.finish_turn("open", "failed")
    restored.start_turn("turn-new")
    before = (view(restored), restored.stats())
    assert backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO()) == 0
    assert (view(restored), restored.stats()) == before
    with pytest.raises(errors.TurnFinished):
        restored.append(AssistantMessage(content="late"), turn_id="open")
    # The same backup into its own source, which it matches, changes nothing either.
    source_before = (view(source.thread("chat")), source.thread("chat").stats())
    backup.import_lines(source, "chat", io.StringIO(text), progress_out=io.StringIO())
    assert (view(source.thread("chat")), source.thread("chat").stats()) == source_before


def test_a_finished_turn_of_the_first_layout_2_form_keeps_its_result(stores, raw_client):
    source, target = stores
    thread = source.thread("old-finished")
    thread.append(UserMessage(content="q"), turn_id="t")
    thread.append(UserMessage(content="between"))
    thread.append([AssistantMessage(content=f"r{i}") for i in range(3)], turn_id="t")
    raw_client.hset(thread.keys.turns, "t", "3|1-1,3-5")
    raw_client.hset(
        thread.keys.meta, mapping={"turn_id": "t", "turn_seq": 3, "turn_outcome": "cancelled"}
    )
    backup.import_lines(
        target,
        "old-finished",
        io.StringIO(export_text(source, "old-finished")),
        progress_out=io.StringIO(),
    )
    expected = thread.finish_turn("t")
    assert expected.outcome == "cancelled" and expected.reply_count == 3
    assert target.thread("old-finished").finish_turn("t") == expected


def test_plain_lines_whose_otids_are_stored_under_other_ids_are_replays(stores):
    _, target = stores
    target.thread("otids").append([UserMessage(content=f"o{i}", otid=f"o{i}") for i in range(10)])
    lines = [
        json.dumps({"message_type": "user_message", "content": f"o{i}", "otid": f"o{i}"}) + "\n"
        for i in range(20)
    ]
    progress = backup.ImportProgress()
    backup.import_lines(target, "otids", iter(lines), progress, progress_out=io.StringIO())
    assert (progress.stored, progress.already) == (10, 10)
    assert [m.otid for m in target.thread("otids").iter()] == [f"o{i}" for i in range(20)]


def test_a_header_it_cannot_restore_is_refused_before_any_write(stores):
    """The header's state is sent last, after every message: a value it cannot hold is refused
    before the first."""
    source, target = stores
    build_thread(source)
    head, *rest = export_text(source).splitlines(keepends=True)
    header = json.loads(head)
    header["turns"][0]["start"] = "soon"
    with pytest.raises(errors.InvalidMessage, match="line 1"):
        backup.import_lines(
            target, "chat", iter([json.dumps(header) + "\n", *rest]), progress_out=io.StringIO()
        )
    assert target.thread("chat").stats().stored_messages == 0


@pytest.mark.parametrize("which", [1, -2])
def test_a_backup_message_without_its_id_is_refused(stores, which):
    source, target = stores
    source.thread("chat").append([UserMessage(content=f"m{i}") for i in range(3)])
    lines = export_text(source).splitlines(keepends=True)
    body = json.loads(lines[which])
    del body["message"]["id"]
    lines[which] = json.dumps(body) + "\n"
    with pytest.raises(errors.InvalidMessage, match="seq_id and id"):
        backup.import_lines(target, "chat", iter(lines), progress_out=io.StringIO())


def test_restore_state_refuses_a_turn_it_could_not_read_back_before_any_write(stores, raw_client):
    from kvstore._engine import core
    from kvstore._engine.operation import ThreadRef

    _, target = stores
    thread = target.thread("state")
    thread.append(UserMessage(content="q"), turn_id="t")
    ref = ThreadRef.of(target.config, "state")
    before = (raw_client.hgetall(thread.keys.meta), raw_client.hgetall(thread.keys.turns))
    for bad in (
        core.TurnRecord("t", 1, "not done", 0, 0, 0, 0, 0),
        core.TurnRecord("t", 1, "open", -1, 0, 0, 0, 0),
    ):
        state = core.BackupState(
            last_seq=1,
            summary_last=1,
            summary_seq=1,
            turns=[core.TurnRecord("u", 0, "open", 0, 0, 0, 0, 0), bad],
        )
        with pytest.raises(errors.InvalidMessage, match="not one a backup holds"):
            target.run(core.restore_state(ref, state))
        assert (
            raw_client.hgetall(thread.keys.meta),
            raw_client.hgetall(thread.keys.turns),
        ) == before


def test_a_restore_call_is_no_larger_than_the_store_allows_an_append():
    from kvstore._engine import core
    from kvstore._engine.operation import ThreadRef

    config = StoreConfig(namespace="n", max_batch_messages=3, max_batch_bytes=100 * 1024)
    run = [
        core.BackedUpMessage(s, None, UserMessage(id=f"m{s}", content="x" * (30 * 1024)))
        for s in range(1, 11)
    ]
    operation = core.restore_run(ThreadRef.of(config, "chat"), run)
    calls, reply = [], None
    try:
        while True:
            call = operation.send(reply)
            calls.append(call.named())
            reply = [len(call.named()["messages"]), 0]  # each restored
    except StopIteration as done:
        assert done.value == (10, 0)
    sizes = [len(args["messages"]) for args in calls]
    assert sizes == [3, 3, 3, 1] and [args["first"] for args in calls] == [1, 4, 7, 10]


@pytest.mark.parametrize("otids", [("a", "b"), ("a", None)])
def test_a_run_whose_otid_is_stored_elsewhere_is_a_restore_conflict(stores, raw_client, otids):
    """Some or all of a run's otids stored at other sequences: one conflict, nothing written."""
    from kvstore._engine import core
    from kvstore._engine.operation import ThreadRef

    _, target = stores
    thread = target.thread("otid")
    thread.append(UserMessage(content="there first", otid="a"))
    before = view(thread, turns=())
    run = [
        core.BackedUpMessage(5 + i, None, UserMessage(id=f"m{i}", content=f"m{i}", otid=otid))
        for i, otid in enumerate(otids)
    ]
    with pytest.raises(errors.RestoreConflict, match="otid a is stored at sequence 1"):
        target.run(core.restore_run(ThreadRef.of(target.config, "otid"), run))
    assert view(thread, turns=()) == before


def test_a_backup_without_messages_over_a_thread_holding_messages_is_refused(stores, raw_client):
    # A thread whose every message was removed backs up as a header alone; its last_seq may
    # equal the target's by chance, which must not let its state overwrite the target's.
    source, target = stores
    gone = source.thread("chat")
    gone.append([UserMessage(content=f"m{i}") for i in range(2)], turn_id="turn-x")
    gone.start_turn("turn-y")
    gone.append(AssistantMessage(content="reply"), turn_id="turn-y")
    gone.remove_turn("turn-x")
    gone.remove_turn("turn-y")
    text = export_text(source)
    assert len(text.strip().splitlines()) == 2 and json.loads(text.splitlines()[0])["last_seq"] == 3
    other = target.thread("chat")
    other.append([UserMessage(content=f"other {i}") for i in range(2)])
    other.compact("what the other thread said", 1)  # its summary is sequence 3: last_seq 3 too
    before = {
        k: raw_client.dump(k)
        for k in raw_client.scan_iter(match=other.keys.meta.rsplit(":", 1)[0] + "*")
    }
    assert other.stats().next_sequence == 4
    other_state = raw_client.hgetall(other.keys.meta)
    with pytest.raises(errors.RestoreConflict):
        backup.import_lines(target, "chat", io.StringIO(text), progress_out=io.StringIO())
    assert raw_client.hgetall(other.keys.meta) == other_state
    after = {
        k: raw_client.dump(k)
        for k in raw_client.scan_iter(match=other.keys.meta.rsplit(":", 1)[0] + "*")
    }
    assert after == before
    # Into an empty thread it restores, and again is a no-op.
    for _ in range(2):
        backup.import_lines(target, "fresh", io.StringIO(text), progress_out=io.StringIO())
        assert target.thread("fresh").stats().next_sequence == 4


def long_thread(store: MessageStore, thread_id: str = "long"):
    """300 messages in turns of three (a question and two replies), every turn finished."""
    thread = store.thread(thread_id)
    for n in range(100):
        turn = f"turn-{n}"
        thread.append(UserMessage(content=f"question {n}"), turn_id=turn)
        thread.start_turn(turn)
        thread.append([AssistantMessage(content=f"answer {n}.{i}") for i in range(2)], turn_id=turn)
        thread.finish_turn(turn)
    return thread


@pytest.mark.parametrize("cut", ["line end", "mid-line"])
def test_a_backup_cut_short_is_refused_and_its_thread_is_not_served(stores, raw_client, cut):
    """A backup proves it is whole (its end line's count and checksum): one cut short, at a
    line end or within a line, fails, and the part it restored refuses writes until the whole
    file is imported."""
    source, target = stores
    original = long_thread(source)
    text = export_text(source, "long")
    lines = text.splitlines(keepends=True)
    short = "".join(lines[:151]) if cut == "line end" else "".join(lines[:151]) + lines[151][:40]
    with pytest.raises((errors.BackupIncomplete, errors.InvalidMessage)):
        backup.import_lines(target, "long", io.StringIO(short), progress_out=io.StringIO())
    half = target.thread("long")
    assert 0 < half.stats().stored_messages < 300 and half.stats().restore_unfinished
    shown = io.StringIO()
    commands.inspect(target, "long", shown)
    assert "restore           unfinished" in shown.getvalue()
    with pytest.raises(errors.RestoreIncomplete):
        half.append(AssistantMessage(content="into the half-restored turn"), turn_id="turn-99")
    with pytest.raises(errors.RestoreIncomplete):
        half.start_turn("turn-99")
    backup.import_lines(target, "long", io.StringIO(text), progress_out=io.StringIO())
    assert not half.stats().restore_unfinished
    assert view(half, turns=("turn-0", "turn-99")) == view(original, turns=("turn-0", "turn-99"))
    check_layout(raw_client, half.keys, target.config)


def test_a_backup_whose_lines_changed_is_refused_before_it_is_finished(stores):
    source, target = stores
    long_thread(source)
    lines = export_text(source, "long").splitlines(keepends=True)
    changed = lines[7].replace("question", "QUESTION")
    assert changed != lines[7]
    lines[7] = changed
    with pytest.raises(errors.BackupIncomplete, match="checksum"):
        backup.import_lines(target, "long", iter(lines), progress_out=io.StringIO())
    with pytest.raises(errors.RestoreIncomplete):
        target.thread("long").append(UserMessage(content="more"))
    dropped = export_text(source, "long").splitlines(keepends=True)
    del dropped[7]
    with pytest.raises(errors.BackupIncomplete, match="299 message lines"):
        backup.import_lines(target, "other", iter(dropped), progress_out=io.StringIO())


def test_a_backup_without_its_end_line_is_refused_unless_allowed_and_whole(stores):
    """A backup written before end lines existed: refused, unless allowed; then its header's
    message count must be the file's."""
    source, target = stores
    original = long_thread(source)
    lines = export_text(source, "long").splitlines(keepends=True)
    assert json.loads(lines[-1]) == {
        "kvstore_backup_end": 2,
        "messages": 300,
        "sha256": json.loads(lines[-1])["sha256"],
    }
    old = lines[:-1]
    with pytest.raises(errors.BackupIncomplete, match="no end line"):
        backup.import_lines(target, "old", iter(old), progress_out=io.StringIO())
    with pytest.raises(errors.BackupIncomplete, match="header"):
        backup.import_lines(
            target, "cut", iter(old[:151]), progress_out=io.StringIO(), allow_untrailed=True
        )
    backup.import_lines(target, "old", iter(old), progress_out=io.StringIO(), allow_untrailed=True)
    assert view(target.thread("old"), turns=("turn-99",)) == view(original, turns=("turn-99",))


def test_lines_after_a_backups_end_line_are_refused(stores):
    source, target = stores
    source.thread("chat").append([UserMessage(content=f"m{i}") for i in range(3)])
    text = export_text(source)
    with pytest.raises(errors.BackupIncomplete, match="after"):
        backup.import_lines(target, "chat", io.StringIO(text + text), progress_out=io.StringIO())


def test_every_write_to_a_thread_whose_restore_is_unfinished_is_refused_and_writes_nothing(
    stores, raw_client
):
    source, target = stores
    long_thread(source)
    lines = export_text(source, "long").splitlines(keepends=True)
    with pytest.raises(errors.BackupIncomplete):
        backup.import_lines(target, "long", iter(lines[:-1]), progress_out=io.StringIO())
    half = target.thread("long")
    first = half.list(limit=1, order="asc").messages[0]
    prefix = half.keys.meta.rsplit(":", 1)[0]
    before = {
        k: raw_client.dump(k)
        for k in raw_client.scan_iter(match=prefix.replace("{", "\\{").replace("}", "\\}") + ":*")
    }
    writes = {
        "append": lambda: half.append(UserMessage(content="new")),
        "start_turn": lambda: half.start_turn("turn-new"),
        "hold_turn": lambda: half.hold_turn("turn-new"),
        "finish_turn": lambda: half.finish_turn("turn-99"),
        "replace": lambda: half.replace(first.id, UserMessage(content="replaced")),
        "remove_turn": lambda: half.remove_turn("turn-0"),
        "compact": lambda: half.compact("a summary", 3),
    }
    for name, write in writes.items():
        with pytest.raises(errors.RestoreIncomplete):
            write()
        after = {
            k: raw_client.dump(k)
            for k in raw_client.scan_iter(
                match=prefix.replace("{", "\\{").replace("}", "\\}") + ":*"
            )
        }
        assert after == before, name


def test_a_newer_backup_over_a_restore_of_an_older_one_is_refused_before_any_write(
    server, namespace, server_only
):
    """Backup B of a thread, taken after retention deleted messages backup A holds, imported
    over a restore of A: its first message is stored at its place, but the thread holds A's
    older ones, which B's state would leave counted yet deleted. Refused, nothing written; B
    into an empty thread, and again over itself, restores (its kept prompt, below its first
    message, is no conflict)."""
    config = StoreConfig(namespace=namespace, retained_message_limit=80)
    with MessageStore.from_url(server.url, config) as store:
        source = store.thread("source")
        source.append(SystemMessage(content="You are terse."))
        source.append([UserMessage(content=f"m{i} " + "y" * 400) for i in range(99)])
        older = export_text(store, "source")
        source.append([UserMessage(content=f"n{i} " + "y" * 400) for i in range(100)])
        source.compact("summary", source.stats().next_sequence - 6)
        assert source.stats().deleted_before_sequence > 1
        newer = export_text(store, "source")
        backup.import_lines(store, "copy", io.StringIO(older), progress_out=io.StringIO())
        before = (view(store.thread("copy"), turns=()), store.thread("copy").stats())
        with pytest.raises(errors.RestoreConflict, match="before the backup"):
            backup.import_lines(store, "copy", io.StringIO(newer), progress_out=io.StringIO())
        assert (view(store.thread("copy"), turns=()), store.thread("copy").stats()) == before
        for _ in range(2):
            backup.import_lines(store, "fresh", io.StringIO(newer), progress_out=io.StringIO())
            fresh, original = store.thread("fresh"), store.thread("source")
            assert view(fresh, turns=()) == view(original, turns=())
            assert fresh.stats().stored_messages == original.stats().stored_messages
